// The simulated openreg device executes torch's own CPU kernels on device
// memory: a DispatchStub kernel for openreg calls the stub's CPU entry with the
// same TensorIterator. This is what makes native ops run at CPU speed.
//
// One thing differs from a CPU iterator. TensorIteratorBase::compute_types only
// promotes operands to the common dtype when the common device is CPU; CUDA's
// kernels cast while loading instead. CPU kernels assume the operands already
// have the common dtype, so run_cpu_stub first gives the iterator what CPU
// would have had (promote_like_cpu) and casts outputs back afterwards.
#pragma once

#include <type_traits>
#include <utility>

#include <ATen/TensorIterator.h>
#include <ATen/native/DispatchStub.h>

namespace openreg::native {

// Inputs whose dtype is not the iterator's common dtype are replaced by copies
// in the common dtype; outputs of another dtype (except bool outputs, which
// the CPU comparison kernels write themselves) compute into a temporary that
// write_back() copies into the caller's tensor. Iterators without a common
// dtype are left alone.
class PromoteLikeCpu {
 public:
  explicit PromoteLikeCpu(at::TensorIteratorBase& iter);
  void write_back();

 private:
  // (caller's output, temporary in the common dtype). The output operand is
  // not exchanged: TensorIteratorBase::cast_outputs, which CPU's Loops.h calls,
  // would then copy through OperandInfo::original_tensor(), which
  // exchange_tensor does not set on this torch version.
  std::vector<std::pair<at::Tensor, at::Tensor>> outputs_;
};

// Iter is TensorIteratorBase or TensorIterator, whichever the stub takes.
template <typename Stub, typename Iter, typename... Args>
void run_cpu_stub(Stub& stub, Iter& iter, Args&&... args) {
  PromoteLikeCpu promoted(iter);
  stub(c10::DeviceType::CPU, iter, std::forward<Args>(args)...);
  promoted.write_back();
}

// The openreg kernel of a stub declared with `cpu_kernel: true` in
// backend_functions.yaml: CpuKernelOf<&at::native::exp_stub>::run has exactly
// the stub's function type.
template <auto* stub, typename FnPtr = typename std::remove_pointer_t<decltype(stub)>::FnPtr>
struct CpuKernelOf;

template <auto* stub, typename Iter, typename... Args>
struct CpuKernelOf<stub, void (*)(Iter&, Args...)> {
  static void run(Iter& iter, Args... args) {
    run_cpu_stub(*stub, iter, std::forward<Args>(args)...);
  }
};

} // namespace openreg::native
