#include "graphs/OpenRegGraph.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceGuard.h>

#include "memory/OpenRegAllocator.h"
#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"
#include "device/OpenRegStream.h"

namespace openreg {
namespace {

orStreamCaptureMode runtime_mode(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal:
      return orStreamCaptureModeThreadLocal;
    case at::GraphCaptureMode::Relaxed:
      return orStreamCaptureModeRelaxed;
    case at::GraphCaptureMode::Default:
    case at::GraphCaptureMode::Global:
      break;
  }
  return orStreamCaptureModeGlobal; // CUDA's default too
}

class OpenRegGraph;

// The graphs being captured, by the runtime stream each captures.
struct Capturing {
  std::mutex mutex;
  std::vector<std::pair<orStream_t, OpenRegGraph*>> graphs;
};
Capturing& capturing() {
  static auto* graphs = new Capturing(); // leaked: graphs may die after static dtors
  return *graphs;
}

class OpenRegGraph final : public at::GraphImplInterface {
 public:
  explicit OpenRegGraph(const at::GraphImplArgs& /*args*/) {}
  OpenRegGraph(const OpenRegGraph&) = delete;
  OpenRegGraph& operator=(const OpenRegGraph&) = delete;
  ~OpenRegGraph() override {
    try {
      reset();
    } catch (const std::exception& e) {
      TORCH_WARN("openreg graph: ", e.what());
    }
  }

  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode mode) override {
    TORCH_CHECK(
        !capturing_ && graph_ == nullptr,
        "This openreg graph already holds a capture; call reset() before capturing into it again.");
    const c10::DeviceIndex device = current_device();
    const c10::Stream stream = current_stream(device);
    TORCH_CHECK(
        stream.id() != 0,
        "openreg graphs must be captured on a non-default stream, as CUDA's (replays may use any stream): capture "
        "under `with torch.openreg.stream(torch.openreg.Stream()):`, as torch.openreg.graph does.");
    TORCH_CHECK(
        !current_stream_capturing(device),
        "openreg graph capture_begin: the current stream is being captured already (by another graph).");
    if (holds_pool_) {
      // The pool of a capture that failed: this capture takes its own use.
      holds_pool_ = false;
      release_mempool(device_, mempool_);
    }
    // A pool named either way: (0, id) as MemPool and graph_pool_handle name
    // theirs, or (id, 0).
    const uint64_t mempool =
        pool.second != 0 ? static_cast<uint64_t>(pool.second)
        : pool.first != 0 ? static_cast<uint64_t>(pool.first)
                          : new_mempool_id();
    orStream_t raw = raw_stream(stream);
    begin_capture_to_pool(device, stream.id(), mempool);
    if (const orError err = orStreamBeginCapture(raw, runtime_mode(mode)); err != orError::Success) {
      end_capture_to_pool(device, stream.id(), mempool);
      release_mempool(device, mempool);
      OPENREG_CHECK(err);
    }
    {
      const std::lock_guard<std::mutex> lock(capturing().mutex);
      capturing().graphs.emplace_back(raw, this);
    }
    device_ = device;
    stream_ = stream;
    mempool_ = mempool;
    holds_pool_ = true;
    capturing_ = true;
  }

  void capture_end() override {
    TORCH_CHECK(capturing_, "capture_end: this openreg graph is not capturing; call capture_begin first.");
    TORCH_CHECK(
        current_stream(device_) == stream_, "capture_end must be called on the stream capture_begin was called on (",
        stream_, "), but the current stream is ", current_stream(device_), ".");
    orGraph_t graph = end_capture();
    size_t nodes = 0;
    OPENREG_CHECK(orGraphGetNodeCount(graph, &nodes));
    graph_ = graph;
    if (nodes == 0 && steps_.empty()) {
      TORCH_WARN(
          "The openreg graph is empty: nothing was launched on the captured stream. This usually means the work "
          "ran on another device or stream than the one captured.");
    }
  }

  void instantiate() override {
    TORCH_CHECK(graph_ != nullptr, "instantiate: this openreg graph holds no capture; capture it first.");
    // Nothing to build: the runtime queues the recorded nodes as they are.
  }

  void replay() override {
    TORCH_CHECK(
        graph_ != nullptr,
        "Called replay() on an openreg graph that holds no capture: capture it first (capture_begin and "
        "capture_end, or `with torch.openreg.graph(g):`).");
    const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
    TORCH_CHECK(
        !current_stream_capturing(device_),
        "replay(): the current stream is being captured; openreg graphs cannot be launched into another capture.");
    const std::lock_guard<std::mutex> lock(replay_mutex_);
    std::vector<std::function<void()>> commits;
    commits.reserve(steps_.size());
    for (const ReplayStep& step : steps_) {
      commits.push_back(step());
    }
    for (const auto& commit : commits) {
      commit();
    }
    OPENREG_CHECK(orGraphLaunch(graph_, current_raw_stream(device_)));
  }

  void reset() override {
    if (capturing_) {
      try {
        orGraph_t graph = end_capture();
        (void)orGraphDestroy(graph);
      } catch (const c10::Error&) {
        // An invalidated capture: nothing to keep.
      }
    }
    if (graph_ != nullptr) {
      OPENREG_CHECK(orGraphDestroy(graph_));
      graph_ = nullptr;
    }
    steps_.clear();
    if (holds_pool_) {
      holds_pool_ = false;
      release_mempool(device_, mempool_);
    }
  }

  at::MempoolId_t pool() const override {
    TORCH_CHECK(
        mempool_ != 0,
        "pool(): this openreg graph has no memory pool yet: it gets one at capture_begin.");
    return {0, static_cast<at::CaptureId_t>(mempool_)};
  }

  void enable_debug_mode() override {
    debug_ = true;
  }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(
        debug_, "debug_dump: call enable_debug_mode() before capturing, as for CUDA graphs.");
    TORCH_CHECK(graph_ != nullptr, "debug_dump: this openreg graph holds no capture.");
    TORCH_CHECK(
        orGraphDebugDotPrint(graph_, path.c_str()) == orError::Success,
        "debug_dump: could not write the graph to ", path);
  }

  void add_step(ReplayStep step) {
    steps_.push_back(std::move(step));
  }

 private:
  // Ends the runtime's capture: the graph, or the error that invalidated it.
  orGraph_t end_capture() {
    capturing_ = false;
    {
      const std::lock_guard<std::mutex> lock(capturing().mutex);
      auto& graphs = capturing().graphs;
      graphs.erase(std::remove_if(graphs.begin(), graphs.end(), [this](const auto& g) { return g.second == this; }),
          graphs.end());
    }
    end_capture_to_pool(device_, stream_.id(), mempool_);
    orGraph_t graph = nullptr;
    const orError err = orStreamEndCapture(raw_stream(stream_), &graph);
    if (err != orError::Success) {
      steps_.clear();
      TORCH_CHECK(
          err != orError::StreamCaptureInvalidated,
          "openreg graph capture failed: a call during the capture waited for the captured stream or the device "
          "(its error was raised then). Nothing was recorded; call reset() and capture again without it.");
      OPENREG_CHECK(err);
    }
    return graph;
  }

  c10::DeviceIndex device_ = 0;
  c10::Stream stream_ = c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::PrivateUse1, 0));
  uint64_t mempool_ = 0;
  bool holds_pool_ = false; // a use of mempool_, until reset
  bool capturing_ = false;
  bool debug_ = false;
  orGraph_t graph_ = nullptr;
  std::vector<ReplayStep> steps_;
  std::mutex replay_mutex_;
};

} // namespace

void add_replay_step(c10::DeviceIndex device, ReplayStep step) {
  orStream_t stream = current_raw_stream(device);
  const std::lock_guard<std::mutex> lock(capturing().mutex);
  for (const auto& [captured, graph] : capturing().graphs) {
    if (captured == stream) {
      graph->add_step(std::move(step));
      return;
    }
  }
  TORCH_CHECK(false, "openreg: the current stream is captured by no openreg graph (a capture begun outside torch?)");
}

void register_graph_impl() {
  static std::once_flag once;
  std::call_once(once, [] {
    at::GraphImplRegistry()->Register(
        c10::DeviceTypeName(c10::DeviceType::PrivateUse1, /*lower_case=*/false),
        [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
          return std::make_unique<OpenRegGraph>(args);
        });
  });
}

} // namespace openreg
