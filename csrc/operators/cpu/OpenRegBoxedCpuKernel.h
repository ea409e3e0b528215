// An operator's CPU kernel on CPU aliases of its openreg operands, driven by
// the operator's schema over a boxed stack: the CPU fallback's way of running
// every operator without an openreg kernel, and the cpu_kernels wrappers' when
// their kernel may be queued.
//
// A CPU kernel computes its results' shapes as it runs, so a launch cannot
// know them from the operands, as a CUDA kernel's host code does. The first
// call with a given geometry of operands (their dtypes, sizes, strides, which
// of them share memory) and non-tensor arguments runs at once in the calling
// thread, in stream order, as before: CPU's argument errors raise at the call,
// and the call learns its results' geometry (each a fresh tensor of a given
// size, stride and storage size, or one of its operands). Later calls with the
// same key, when the kernel may be queued (CpuKernelCall::may_queue), allocate
// results of that geometry at once, return them, and queue the CPU kernel on
// the current stream; its allocations of the results' sizes get their memory
// (PlannedCpuAllocations), so it writes them in place. docs/integration/streams.md,
// "CPU kernels and the fallback", says which operators never queue.
#pragma once

#include <utility>

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace openreg {

// Whether a call may draw random numbers, which is never queued: as the
// operator's tags say (nondeterministic_seeded), or not at all, as the caller
// knows from the arguments (CPU's flash attention without dropout).
enum class Draws { kByTags, kNone };

// Runs `op`'s `kernel_key` kernel (CPU, or NestedTensorCPU for nested
// tensors) on CPU aliases of the openreg tensors on `stack`, replacing its
// arguments by its results: at once, or queued as above.
void run_cpu_kernel_boxed(
    const c10::OperatorHandle& op,
    torch::jit::Stack* stack,
    c10::DispatchKey kernel_key,
    Draws draws = Draws::kByTags);

// The handle of operator `name`.`overload` (for launch_cpu_kernel).
c10::OperatorHandle cpu_kernel_operator(const char* name, const char* overload);

namespace detail {
void boxed_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void boxed_cpu_kernel_drawing_nothing(const c10::OperatorHandle& op, torch::jit::Stack* stack);
} // namespace detail

// For a cpu_kernels wrapper (signature Sig) whose kernel may be queued, and
// for openreg kernels that run another operator's CPU kernel (fused
// attention): run_cpu_kernel_boxed of `op`'s CPU kernel on the arguments,
// boxed, and its results unboxed.
template <class Sig, Draws draws = Draws::kByTags, class... Args>
decltype(auto) launch_cpu_kernel(const c10::OperatorHandle& op, Args&&... args) {
  static const c10::BoxedKernel kernel = c10::BoxedKernel::makeFromFunction<
      draws == Draws::kNone ? &detail::boxed_cpu_kernel_drawing_nothing : &detail::boxed_cpu_kernel>();
  return c10::impl::BoxedKernelWrapper<Sig>::call(
      kernel, op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), std::forward<Args>(args)...);
}

} // namespace openreg
