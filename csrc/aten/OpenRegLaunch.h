// Launching a kernel: host code queued on the current stream of a device
// (orLaunchKernel, docs/runtime.md), which runs it after the work queued
// before it while the caller goes on.
//
// What the kernel needs must be captured by value: it runs after the caller
// returned. A tensor is captured as kernel_argument(t), which, like a CUDA
// kernel's pointer argument, does not keep device memory alive: the caller
// may drop its tensors at once, and the caching allocator hands their blocks
// only to later work on the same stream (or, after record_stream, after the
// other streams' work), which the stream orders after this kernel.
// On the stream's worker the kernel sees the launching thread's intra-op
// thread count and runs below autograd (a kernel's own tensor calls, a cast
// say, are not recorded); a call inside a kernel that launches another
// kernel runs it at once (orLaunchKernel).
#pragma once

#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <ATen/Parallel.h>
#include <ATen/core/TensorBase.h>
#include <c10/util/ArrayRef.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "aten/OpenRegException.h"
#include "aten/OpenRegStream.h"
#include "aten/OpenRegTrace.h"

namespace openreg {

// A tensor over t's memory with t's geometry and dtype that owns nothing: its
// storage is a bare pointer. Over device memory (an openreg tensor, or a CPU
// alias at kernel addresses) only stream order keeps the bytes meaningful,
// as for a CUDA kernel; the view has no Python object, so a kernel's worker
// may drop it without the GIL.
at::Tensor kernel_view(const at::TensorBase& t);
// A CPU tensor over the kernel addresses of openreg tensor t's memory, owning
// nothing: a kernel running CPU code on device memory (a CPU alias a kernel
// may hold; CpuAliases' are for the calling thread).
at::Tensor kernel_cpu_view(const at::TensorBase& t);

// What a queued kernel keeps of one argument of its launch: a kernel_view of
// an openreg tensor, a copy of a CPU tensor (host memory is not stream
// ordered: a CPU scalar operand is often a temporary of the caller, and CUDA
// passes its value), anything else by value.
at::Tensor kernel_tensor_argument(const at::TensorBase& t);
template <typename T>
constexpr bool is_array_ref = false;
template <typename T>
constexpr bool is_array_ref<c10::ArrayRef<T>> = true;
template <typename T>
auto kernel_argument(T&& value) {
  if constexpr (std::is_base_of_v<at::TensorBase, std::decay_t<T>>) {
    return kernel_tensor_argument(value);
  } else {
    static_assert(
        !is_array_ref<std::decay_t<T>>,
        "an ArrayRef borrows the caller's memory: copy it into a vector before the launch");
    return std::decay_t<T>(std::forward<T>(value));
  }
}

namespace detail {

// Set while the calling thread runs a kernel in its own place in the stream
// (run_kernel_inline): launches it makes run at once, as on a worker.
inline thread_local int inline_kernels = 0;

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

// True where a launch must run at once: on a stream's worker, or in a kernel
// the calling thread runs in stream order (run_kernel_inline).
inline bool inside_kernel() {
  return detail::inline_kernels > 0 || orInsideKernel();
}

// Runs body() in the calling thread after the work queued on the current
// stream of `device`, so its errors raise here with their own type; kernels it
// launches run at once, keeping stream order.
template <typename F>
void run_kernel_inline(c10::DeviceIndex device, F&& body) {
  join_current_stream(device);
  ++detail::inline_kernels;
  struct Leave {
    ~Leave() {
      --detail::inline_kernels;
    }
  } leave;
  body();
}

// Queues body() on the current stream of `device`; `name` (a string literal)
// names it in the error a failure raises.
template <typename F>
void launch_kernel(c10::DeviceIndex device, const char* name, F&& body) {
  if (inside_kernel()) {
    body();
    return;
  }
  if (orLaunchBlocking()) {
    // OPENREG_LAUNCH_BLOCKING=1: an error is raised by this call.
    run_kernel_inline(device, std::forward<F>(body));
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
