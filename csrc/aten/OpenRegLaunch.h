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

#include <atomic>
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

// What kernel_view needs of a tensor, captured without touching its
// TensorImpl's reference count: a launch captures it in the calling thread,
// and the kernel's thread makes the view, so allocating and freeing the view
// both happen where the kernel runs.
struct KernelTensorMeta {
  void* data = nullptr; // the storage's data
  size_t nbytes = 0;
  c10::Device device = c10::Device(c10::kCPU);
  caffe2::TypeMeta dtype;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  bool conj = false;
  bool neg = false;
  bool defined = false;
};
KernelTensorMeta kernel_tensor_meta(const at::TensorBase& t);
at::Tensor kernel_view(const KernelTensorMeta& meta);

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

// Kernels this thread is running (a queued one on a stream's worker, or one
// the calling thread runs in its place in the stream): launches made while it
// is not 0 run at once.
inline thread_local int running_kernels = 0;

struct RunningKernel {
  RunningKernel() {
    ++running_kernels;
  }
  RunningKernel(const RunningKernel&) = delete;
  RunningKernel& operator=(const RunningKernel&) = delete;
  ~RunningKernel() {
    --running_kernels;
  }
};

// Memory for queued kernels. The runtime releases a completed kernel in a
// thread that launches or synchronizes on its stream, as a rule the thread
// that launched it, so a small cache per thread of freed blocks, by size,
// serves most launches without malloc (an iterator's kernel is larger than
// glibc's per-thread cache takes).
void* allocate_kernel(size_t bytes);
void free_kernel(void* block, size_t bytes) noexcept;

// A kernel's body as the runtime runs it: below autograd (a kernel's own
// tensor calls, a cast say, are not recorded), a c10::Error as the
// runtime's failure without c10's C++ backtrace.
template <typename Body>
void run_body(Body& body) {
  const c10::impl::ExcludeDispatchKeyGuard below_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  try {
    body();
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

template <typename Body>
struct QueuedKernel {
  Body body;
  int threads;

  static void* operator new(size_t bytes) {
    return allocate_kernel(bytes);
  }
  static void operator delete(void* block, size_t bytes) noexcept {
    free_kernel(block, bytes);
  }

  static void run(void* self) {
    auto& kernel = *static_cast<QueuedKernel*>(self);
    if (at::get_num_threads() != kernel.threads) {
      at::set_num_threads(kernel.threads);
    }
    const RunningKernel running;
    run_body(kernel.body);
  }

  static void release(void* self) {
    delete static_cast<QueuedKernel*>(self);
  }
};

} // namespace detail

// True where a launch must run at once: in a kernel, queued or run by the
// calling thread in stream order (run_kernel_inline, run_small_kernel_if_idle).
inline bool inside_kernel() {
  return detail::running_kernels > 0;
}

// Runs body() in the calling thread after the work queued on the current
// stream of `device`, so its errors raise here with their own type; kernels it
// launches run at once, keeping stream order.
template <typename F>
void run_kernel_inline(c10::DeviceIndex device, F&& body) {
  join_current_stream(device);
  const detail::RunningKernel running;
  body();
}

// Elements below which a kernel is small: run at once on an idle stream,
// where queueing it would cost more than running it (docs/runtime.md,
// "Kernels"). torch's CPU kernels do not split work below this size between
// threads either (at::internal::GRAIN_SIZE).
constexpr int64_t kSmallKernel = 32768;

// The runtime's launch switches (fixed when it starts, which a launch
// follows), read once into a global atomic: every launch reads them.
namespace detail {
enum LaunchSwitch : int { kLaunchBlocking = 1, kQueueAllKernels = 2, kSwitchesRead = 4 };
inline std::atomic<int> launch_switches{0};
int read_launch_switches();
inline int switches() {
  const int read = launch_switches.load(std::memory_order_relaxed);
  return C10_LIKELY(read != 0) ? read : read_launch_switches();
}
} // namespace detail
inline bool launch_blocking() {
  return (detail::switches() & detail::kLaunchBlocking) != 0;
}
inline bool queue_all_kernels() {
  return (detail::switches() & detail::kQueueAllKernels) != 0;
}

// `name` failed with `message` in the calling thread, in stream order: the
// failure becomes the current stream's, reported like a queued kernel's.
void record_kernel_failure(c10::DeviceIndex device, const char* name, const char* message);

// Runs body() in the calling thread if `work` (elements) is small and the
// current stream of `device` has nothing queued, as a device that completes
// it before the launch returns would: a failure becomes the stream's,
// reported at the next synchronization as a queued kernel's. False, without
// running it, if it must be queued (or OPENREG_QUEUE_ALL_KERNELS=1).
template <typename F>
bool run_small_kernel_if_idle(c10::DeviceIndex device, const char* name, int64_t work, F& body) {
  if (work >= kSmallKernel || queue_all_kernels() || !current_stream_idle(device)) {
    return false;
  }
  if (C10_UNLIKELY(trace::observed(trace::kProfile))) {
    trace::stream_joined(device);
  }
  // Below autograd already: an operator's kernel launches it.
  const detail::RunningKernel running;
  try {
    body();
  } catch (const c10::Error& e) {
    record_kernel_failure(device, name, e.what_without_backtrace());
  } catch (const std::exception& e) {
    record_kernel_failure(device, name, e.what());
  }
  return true;
}

// Queues the kernel make() returns on the current stream of `device`; `name`
// (a string literal) names it in the error a failure raises. The kernel is
// made where the queue keeps it (a large one, an iterator's, is not moved).
template <typename Make>
void launch_kernel_made(c10::DeviceIndex device, const char* name, Make&& make) {
  if (inside_kernel()) {
    make()();
    return;
  }
  if (launch_blocking()) {
    // OPENREG_LAUNCH_BLOCKING=1: an error is raised by this call.
    run_kernel_inline(device, make());
    return;
  }
  if (C10_UNLIKELY(trace::observed(trace::kProfile))) {
    trace::stream_joined(device);
  }
  using Kernel = detail::QueuedKernel<decltype(make())>;
  auto* kernel = new Kernel{make(), at::get_num_threads()};
  OPENREG_CHECK(orLaunchKernel(current_raw_stream(device), &Kernel::run, kernel, &Kernel::release, name));
}

// Queues body() on the current stream of `device`, or runs it at once if
// its `work` (elements) is small and the stream idle (run_small_kernel_if_idle).
template <typename F>
void launch_kernel(c10::DeviceIndex device, const char* name, int64_t work, F&& body) {
  if (!inside_kernel() && !launch_blocking() && run_small_kernel_if_idle(device, name, work, body)) {
    return;
  }
  launch_kernel_made(device, name, [&]() -> std::decay_t<F> { return std::forward<F>(body); });
}

} // namespace openreg
