// openreg's ProfilerStubs: the event-based device timing torch's profiler uses
// in state KINETO_PRIVATEUSE1_FALLBACK, i.e. torch.autograd.profiler.profile(
// use_device="openreg") without use_kineto=True.
//
// Around every operator torch records an event on the current stream at entry
// and at exit (torch/csrc/profiler/collection.cpp begin_op / end_op), and after
// the run asks for the time between them (KinetoEvent::privateuse1Elapsed),
// which Python adds to the operator as its device time. This is what
// torch/csrc/profiler/stubs/cuda.cpp does with cudaEvents.
#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"
#include "device/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::profiler {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

orEvent_t as_event(const ProfilerVoidEventStub* stub) {
  return static_cast<orEvent_t>(stub->get());
}

struct OpenRegProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = current_device();
    if (device != nullptr) {
      *device = index;
    }
    orEvent_t raw = nullptr;
    OPENREG_CHECK(orEventCreateWithFlags(&raw, orEventDefault));
    *event = std::shared_ptr<void>(raw, [](void* e) { orEventDestroy(static_cast<orEvent_t>(e)); });
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
    OPENREG_CHECK(orEventRecord(raw, raw_stream(current_stream(index))));
  }

  // Microseconds, as the CUDA stubs return.
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    OPENREG_CHECK(orEventSynchronize(as_event(start)));
    OPENREG_CHECK(orEventSynchronize(as_event(end)));
    float ms = 0;
    OPENREG_CHECK(orEventElapsedTime(&ms, as_event(start), as_event(end)));
    return ms * 1000.0f;
  }

  // openreg has no range annotations (NVTX's role for CUDA).
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override {
    return true;
  }

  void onEachDevice(std::function<void(int)> op) const override {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, d));
      op(d);
    }
  }

  void synchronize() const override {
    openreg::synchronize(current_device());
  }
};

// Registered when torch_openreg._C loads, like the Kineto profiler.
const bool registered = [] {
  static OpenRegProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  return true;
}();

} // namespace
} // namespace openreg::profiler
