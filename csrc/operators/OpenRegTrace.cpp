#include "operators/OpenRegTrace.h"

#include <iostream>

#include <ATen/core/dispatch/Dispatcher.h>

#include "runtime/OpenRegRuntime.h"

namespace openreg::trace {
namespace {

std::atomic<ProfilerHook> profiler_hook{nullptr};
// The outermost call open on this thread while the profiler observes it.
thread_local Call* profiled_call = nullptr;

// Release wheels of torch print nothing for TORCH_SHOW_DISPATCH_TRACE=1; the
// variable is read (and validated) by torch's own accessor.
const bool print_from_env = [] {
  if (c10::show_dispatch_trace()) {
    set_observer(kPrint, true);
  }
  return true;
}();

void print(const Call& call) {
  // One write per line, in torch's format (Dispatcher.cpp _print_dispatch_trace),
  // indented by torch's own nesting counter so that, on a debug build of
  // torch, these lines nest among the dispatcher's.
  std::string line(static_cast<size_t>(c10::dispatch_trace_nesting_value()), ' ');
  line += call.route == Route::StubKernel || call.route == Route::StubCpuKernel ? "[stub]" : "[call]";
  line += " op=[" + call_name(call) + "], key=[" + (call.key != nullptr ? call.key : route_key(call.route)) + "] -> ";
  line += route_name(call.route);
  if (call.kernel != nullptr) {
    line += ' ';
    line += call.kernel;
  }
  line += '\n';
  std::cerr << line << std::flush;
}

} // namespace

const char* route_key(Route route) {
  switch (route) {
    case Route::NestedFallback:
    case Route::NestedBlocked:
      return "NestedTensorPrivateUse1";
    case Route::SparseFallback:
    case Route::SparseBlocked:
      return "SparsePrivateUse1";
    default:
      return "PrivateUse1";
  }
}

std::string call_name(const Call& call) {
  return call.op_name != nullptr ? c10::toString(*call.op_name) : std::string(call.op);
}

void set_observer(uint32_t bit, bool on) {
  if (on) {
    observers.fetch_or(bit);
  } else {
    observers.fetch_and(~bit);
  }
}

void set_profiler_hook(ProfilerHook hook) {
  profiler_hook.store(hook);
}

namespace {
std::atomic<QueuedKernelHook> queued_kernel_hook{nullptr};
} // namespace

void set_queued_kernel_hook(QueuedKernelHook hook) {
  queued_kernel_hook.store(hook);
}

QueuedKernel queued_kernel(int device, uint64_t stream) noexcept {
  QueuedKernel kernel;
  if (profiled_call != nullptr) {
    kernel.call = *profiled_call;
  }
  kernel.device = device;
  kernel.stream = stream;
  kernel.correlation_id = orActivityGetExternalCorrelationId();
  return kernel;
}

void queued_kernel_ran(QueuedKernel& kernel) noexcept {
  kernel.end_ns = orActivityGetTimestamp();
  if (QueuedKernelHook hook = queued_kernel_hook.load()) {
    hook(kernel);
  }
}

void stream_joined(int device) noexcept {
  Call* call = profiled_call;
  if (call != nullptr && call->device_start_ns == 0) {
    call->device = device;
    call->device_start_ns = orActivityGetTimestamp();
  }
}

void Scope::begin(uint32_t watching) noexcept {
  watching_ = watching;
  if (watching & kPrint) {
    print(call_);
    c10::dispatch_trace_nesting_incr();
  }
  if (watching & kProfile) {
    if (profiled_call == nullptr) {
      profiled_call = &call_;
    }
    if (ProfilerHook hook = profiler_hook.load()) {
      hook(call_, /*begin=*/true);
    }
  }
}

void Scope::end() noexcept {
  if (watching_ & kProfile) {
    if (ProfilerHook hook = profiler_hook.load()) {
      hook(call_, /*begin=*/false);
    }
    if (profiled_call == &call_) {
      profiled_call = nullptr;
    }
  }
  if (watching_ & kPrint) {
    c10::dispatch_trace_nesting_decr();
  }
}

} // namespace openreg::trace
