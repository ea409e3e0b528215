// One instrumentation point for every call the openreg backend serves. Every
// route (OpenRegRoutes.h) opens a Scope: the generated wrappers, the stub
// kernels, the fallbacks and blocked operators. A Scope serves two observers:
// - the dispatch trace (TORCH_SHOW_DISPATCH_TRACE=1, or
//   torch.openreg.set_dispatch_trace): one line per call in PyTorch's own
//   trace format, followed by how openreg served it, indented by nesting;
// - the profiler hook (csrc/profiler), which records device activity.
// With no observer, a Scope costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include <ATen/core/operator_name.h>
#include <c10/macros/Macros.h>

#include "operators/OpenRegRoutes.h"

namespace openreg::trace {

// The dispatch key a call of this route was served under, as the dispatch
// trace names it ("PrivateUse1", "NestedTensorPrivateUse1"; the sparse
// routes serve two keys, which their calls name themselves).
const char* route_key(Route route);

// Observer bits.
inline constexpr uint32_t kPrint = 1;
inline constexpr uint32_t kProfile = 2;

inline std::atomic<uint32_t> observers{0};

void set_observer(uint32_t bit, bool on);
inline bool observed(uint32_t bit) {
  return (observers.load(std::memory_order_relaxed) & bit) != 0;
}

// One call, as observers see it.
struct Call {
  const char* op = nullptr; // "aten::add.Tensor", or a stub's name
  const c10::OperatorName* op_name = nullptr; // instead of `op` (the fallback)
  Route route = Route::Kernel;
  const char* kernel = nullptr; // the function that serves it, if any
  // The dispatch key, where route_key(route) cannot tell it: a sparse call's
  // (SparsePrivateUse1 or SparseCsrPrivateUse1).
  const char* key = nullptr;
  // While the profiler observes, the outermost call on a thread learns when
  // its device work began: the first time it (or a call inside it) joins a
  // device's current stream to touch that device's memory (stream_joined).
  // Calls that touch no device memory (allocation, views, metadata, blocked
  // operators) keep -1 / 0.
  int device = -1;
  int64_t device_start_ns = 0; // orActivityGetTimestamp's clock
};

// The name `[call] op=[...]` shows.
std::string call_name(const Call& call);

// Called with begin=true when a scope opens and begin=false when it closes,
// while kProfile is set.
using ProfilerHook = void (*)(Call& call, bool begin);
void set_profiler_hook(ProfilerHook hook);

// A stub, its route (StubKernel or StubCpuKernel) and its kernel, for TracedStub.
struct Site {
  const char* stub;
  Route route;
  const char* kernel;
};

// A kernel launched onto a stream while the profiler observes: the outermost
// call that launched it (its device and device_start_ns unused), where it was
// queued, and when it ran there. The launch fills what it knows
// (queued_kernel); the kernel's run, start_ns and end_ns.
struct QueuedKernel {
  Call call;
  int device = -1;
  uint64_t stream = 0; // orStreamGetId
  uint64_t correlation_id = 0; // the launching thread's (orActivityGetExternalCorrelationId)
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};
using QueuedKernelHook = void (*)(const QueuedKernel& kernel);
void set_queued_kernel_hook(QueuedKernelHook hook);
// At a launch while kProfile is observed: what the profiler will need of the
// kernel being queued on `stream` of `device`.
QueuedKernel queued_kernel(int device, uint64_t stream) noexcept;
// In the kernel's thread, once it ran (or failed).
void queued_kernel_ran(QueuedKernel& kernel) noexcept;

// Called by join_current_stream, while kProfile is observed, once earlier
// work on `device`'s current stream is done and the caller is about to touch
// the device's memory: marks the start of the outermost open call's device
// work, unless an earlier join did.
void stream_joined(int device) noexcept;

class Scope {
 public:
  Scope(const char* op, Route route, const char* kernel) noexcept {
    call_.op = op;
    call_.route = route;
    call_.kernel = kernel;
    const uint32_t watching = observers.load(std::memory_order_relaxed);
    if (C10_UNLIKELY(watching != 0)) {
      begin(watching);
    }
  }
  Scope(const c10::OperatorName& op, Route route) noexcept {
    call_.op_name = &op;
    call_.route = route;
    const uint32_t watching = observers.load(std::memory_order_relaxed);
    if (C10_UNLIKELY(watching != 0)) {
      begin(watching);
    }
  }
  // A call whose route serves two dispatch keys (the sparse fallback).
  Scope(const c10::OperatorName& op, Route route, const char* key) noexcept {
    call_.op_name = &op;
    call_.route = route;
    call_.key = key;
    const uint32_t watching = observers.load(std::memory_order_relaxed);
    if (C10_UNLIKELY(watching != 0)) {
      begin(watching);
    }
  }
  ~Scope() {
    if (C10_UNLIKELY(watching_ != 0)) {
      end();
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void begin(uint32_t watching) noexcept;
  void end() noexcept;

  Call call_;
  uint32_t watching_ = 0;
};

// The openreg kernel of a DispatchStub behind a trace scope: the generated
// RegisterStubs.cpp registers TracedStub<FnPtr>::run<&site, &kernel>, which
// has exactly the stub's function type.
template <typename FnPtr>
struct TracedStub;

template <typename R, typename... Args>
struct TracedStub<R (*)(Args...)> {
  template <const Site* site, R (*kernel)(Args...)>
  static R run(Args... args) {
    const Scope scope(site->stub, site->route, site->kernel);
    return kernel(std::forward<Args>(args)...);
  }
};

} // namespace openreg::trace
