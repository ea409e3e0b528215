// openreg as a Kineto child profiler: what torch.profiler.profile(activities=
// [..., ProfilerActivity.PrivateUse1]) and torch.autograd.profiler.profile(
// use_device="openreg", use_kineto=True) collect from the device.
//
// torch forwards the factory registered here to Kineto when a profiler starts
// in state KINETO_PRIVATEUSE1 (torch/csrc/autograd/profiler_kineto.cpp
// prepareProfiler -> PrivateUse1ProfilerRegistry::onKinetoInit). Kineto then
// asks the profiler for a session per trace (GenericActivityProfiler::
// configureChildProfilers), starts and stops it with the trace, forwards every
// pushCorrelationId / popCorrelationId torch makes around an operator, and
// finally has the session log its activities, linked to the CPU operator whose
// correlation id they carry. torch's kineto_shim (deviceTypeFromActivity) maps
// CONCURRENT_KERNEL and GPU_MEMCPY to DeviceType.PrivateUse1 once the backend
// is renamed, which is how the activities reach Python as openreg events and
// add device time to their operator.

// torch itself is built with USE_KINETO (caffe2/core/macros.h CXX_FLAGS); its
// Kineto-facing headers compile their declarations only under it.
#ifndef USE_KINETO
#define USE_KINETO
#endif
// Kineto's GenericTraceActivity formats metadata with fmt, whose compiled part
// torch links privately (no fmt::vformat is exported): use fmt header-only.
#define FMT_HEADER_ONLY

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include "profiler/OpenRegActivityRecorder.h"

namespace openreg::profiler {
namespace {

using libkineto::ActivityType;

// Kineto's activity types for a device that is not CUDA: on-device kernels
// and copies (kineto_shim.cpp kPrivateUse1Types also lists runtime/driver
// types, which openreg has no separate API layer for).
const std::set<ActivityType>& supported_types() {
  static const std::set<ActivityType> types{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY};
  return types;
}

// [start, end) minus the intervals in `holes` (sorted by start): what is left
// of a kernel once the copies it issued itself are taken out.
std::vector<std::pair<int64_t, int64_t>> subtract(
    int64_t start,
    int64_t end,
    const std::vector<std::pair<int64_t, int64_t>>& holes) {
  std::vector<std::pair<int64_t, int64_t>> left;
  int64_t from = start;
  for (const auto& [hole_start, hole_end] : holes) {
    if (hole_end <= from || hole_start >= end) {
      continue;
    }
    if (hole_start > from) {
      left.emplace_back(from, hole_start);
    }
    from = std::max(from, hole_end);
  }
  if (from < end) {
    left.emplace_back(from, end);
  }
  return left;
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  Session(bool kernels, bool copies) : kernels_(kernels), copies_(copies) {}

  ~Session() override {
    if (status_ == libkineto::TraceStatus::RECORDING) {
      stop_recording();
    }
  }

  void start() override {
    start_recording(kernels_, copies_);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (status_ != libkineto::TraceStatus::RECORDING) {
      return;
    }
    activities_ = stop_recording();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    return {};
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(
      libkineto::ActivityLogger& logger,
      libkineto::getLinkedActivityCallback linked_activity,
      int64_t start_ns,
      int64_t end_ns) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns, end_ns, "openreg");
    buffer_->gpuOpCount = 0;

    // A call's copies (same correlation id) are shown as copies; its kernel
    // keeps the rest of its time, so no device time is counted twice.
    std::unordered_map<uint64_t, std::vector<std::pair<int64_t, int64_t>>> copies_of;
    for (const Activity& a : activities_) {
      if (a.kind == Activity::Kind::Memcpy && a.correlation_id != 0) {
        copies_of[a.correlation_id].emplace_back(a.start_ns, a.end_ns);
      }
    }
    for (auto& [id, intervals] : copies_of) {
      std::sort(intervals.begin(), intervals.end());
    }
    for (const Activity& a : activities_) {
      if (a.kind == Activity::Kind::Kernel) {
        auto it = copies_of.find(a.correlation_id);
        if (it == copies_of.end()) {
          emit(a, a.start_ns, a.end_ns, linked_activity);
        } else {
          for (const auto& [start, end] : subtract(a.start_ns, a.end_ns, it->second)) {
            emit(a, start, end, linked_activity);
          }
        }
      } else {
        emit(a, a.start_ns, a.end_ns, linked_activity);
      }
    }
    for (const auto& activity : buffer_->activities) {
      activity->log(logger);
    }
    status_ = libkineto::TraceStatus::READY;
  }

  // Kineto takes one DeviceInfo per session, so only the first device the
  // activities ran on gets a process label; stream rows (getResourceInfos)
  // name their device. Returning none would have Kineto label the rows of
  // devices 0-15 "GPU n" (GenericActivityProfiler::finalizeTrace).
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    const int64_t device = streams_.empty() ? 0 : streams_.begin()->first;
    // Sorted below the host's rows, as Kineto sorts GPUs.
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, device + libkineto::kExceedMaxPid, "openreg", "openreg:" + std::to_string(device)});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> infos;
    for (const auto& [device, stream] : streams_) {
      infos.push_back(libkineto::ResourceInfo{
          static_cast<int64_t>(stream), static_cast<int64_t>(stream), device,
          "openreg:" + std::to_string(device) + " stream " + std::to_string(stream)});
    }
    return infos;
  }

  // The activities outlive the session with the trace, which keeps their
  // TraceSpan too (GenericActivityProfiler::finalizeTrace).
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);
  }

  // Called on the thread of the operator that pushes the id (torch's
  // RecordFunction observer, collection.cpp begin_op); the runtime keeps the
  // stack per thread, so kernels and copies that operator issues carry it.
  void pushCorrelationId(uint64_t id) override {
    orActivityPushExternalCorrelationId(id);
  }

  void popCorrelationId() override {
    orActivityPopExternalCorrelationId();
  }

 private:
  void emit(
      const Activity& a,
      int64_t start_ns,
      int64_t end_ns,
      const libkineto::getLinkedActivityCallback& linked_activity) {
    const bool kernel = a.kind == Activity::Kind::Kernel;
    buffer_->emplace_activity(
        buffer_->span, kernel ? ActivityType::CONCURRENT_KERNEL : ActivityType::GPU_MEMCPY, a.name);
    libkineto::GenericTraceActivity& act = *buffer_->activities.back();
    act.startTime = start_ns;
    act.endTime = end_ns;
    // Kineto keeps correlation ids as int32 (TraceWrapper::addCPUActivity).
    act.id = static_cast<int32_t>(a.correlation_id);
    act.device = a.device;
    act.resource = static_cast<int32_t>(a.stream);
    act.threadId = static_cast<int32_t>(a.stream);
    if (a.correlation_id != 0 && linked_activity) {
      act.linked = linked_activity(act.id);
    }
    act.addMetadata("device", a.device);
    act.addMetadata("stream", a.stream);
    act.addMetadata("correlation", a.correlation_id);
    if (kernel) {
      act.addMetadataQuoted("route", a.route);
    } else {
      act.addMetadata("bytes", a.bytes);
      const int64_t ns = a.end_ns - a.start_ns;
      if (ns > 0) {
        act.addMetadata("memory bandwidth (GB/s)", static_cast<double>(a.bytes) / static_cast<double>(ns));
      }
    }
    ++buffer_->gpuOpCount;
    streams_.emplace(a.device, a.stream);
  }

  const bool kernels_;
  const bool copies_;
  std::vector<Activity> activities_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::set<std::pair<int, uint64_t>> streams_;
};

class OpenRegKinetoProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    return name_;
  }

  const std::set<ActivityType>& availableActivities() const override {
    return supported_types();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& activity_types,
      const libkineto::Config& /*config*/) override {
    const bool kernels = activity_types.count(ActivityType::CONCURRENT_KERNEL) != 0;
    const bool copies = activity_types.count(ActivityType::GPU_MEMCPY) != 0;
    if (!kernels && !copies) {
      return nullptr; // a CPU-only trace: openreg records nothing
    }
    return std::make_unique<Session>(kernels, copies);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/,
      int64_t /*duration_ms*/,
      const std::set<ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"openreg"};
};

// Registered when torch_openreg._C loads; torch hands it to Kineto at the
// first KINETO_PRIVATEUSE1 profile.
REGISTER_PRIVATEUSE1_PROFILER(OpenRegKinetoProfiler);

} // namespace
} // namespace openreg::profiler
