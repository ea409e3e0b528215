// Launching a kernel: host code queued on the current stream of a device
// (orLaunchKernel, docs/runtime.md), which runs it after the work queued
// before it while the caller goes on.
//
// What the kernel needs must be captured by value: it runs after the caller
// returned. Tensors captured keep their memory until the kernel has run.
// On the stream's worker the kernel sees the launching thread's intra-op
// thread count and runs below autograd (a kernel's own tensor calls, a cast
// say, are not recorded); a call inside a kernel that launches another
// kernel runs it at once (orLaunchKernel).
#pragma once

#include <atomic>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "aten/OpenRegException.h"
#include "aten/OpenRegStream.h"
#include "aten/OpenRegTrace.h"

namespace openreg {

namespace detail {

template <typename Body>
struct QueuedKernel {
  Body body;
  int threads;

  static void run(void* self) {
    auto& kernel = *static_cast<QueuedKernel*>(self);
    if (at::get_num_threads() != kernel.threads) {
      at::set_num_threads(kernel.threads);
    }
    const c10::impl::ExcludeDispatchKeyGuard below_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    try {
      kernel.body();
    } catch (const c10::Error& e) {
      // The runtime keeps what() as the kernel's failure; c10's what() ends
      // with a C++ backtrace.
      throw std::runtime_error(e.what_without_backtrace());
    }
  }

  static void release(void* self) {
    delete static_cast<QueuedKernel*>(self);
  }
};

} // namespace detail

// Set while torch.openreg.sanitizer is enabled (_C._set_launches_in_caller).
// Not GPUTrace::get_trace(): torch cannot turn the trace off again.
inline std::atomic<bool>& launches_in_caller() {
  static std::atomic<bool> flag{false};
  return flag;
}

// Queues body() on the current stream of `device`; `name` (a string literal)
// names it in the error a failure raises.
template <typename F>
void launch_kernel(c10::DeviceIndex device, const char* name, F&& body) {
  if (orInsideKernel()) {
    body();
    return;
  }
  // OPENREG_LAUNCH_BLOCKING=1: in stream order, in the calling thread, so
  // an error is raised by this call with its own type. Likewise while the
  // sanitizer is on (torch.openreg.sanitizer): a queued kernel holds its
  // tensors until it has run, so their memory would be freed, and the free
  // reported to the GPU trace, whenever the kernel happens to be done, where
  // on CUDA it is freed when the program drops it.
  if (orLaunchBlocking() || C10_UNLIKELY(launches_in_caller().load(std::memory_order_relaxed))) {
    join_current_stream(device);
    body();
    return;
  }
  if (C10_UNLIKELY(trace::observed(trace::kProfile))) {
    trace::stream_joined(device);
  }
  using Kernel = detail::QueuedKernel<std::decay_t<F>>;
  auto* kernel = new Kernel{std::forward<F>(body), at::get_num_threads()};
  OPENREG_CHECK(orLaunchKernel(current_raw_stream(device), &Kernel::run, kernel, &Kernel::release, name));
}

} // namespace openreg
