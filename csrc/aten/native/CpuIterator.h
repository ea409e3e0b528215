// TensorIterators on device memory: the CPU kernel of a stub run on an
// openreg iterator (run_cpu_stub, CpuKernelOf), an iterator pointed at kernel
// addresses (use_kernel_addresses, prepare_structured_impl).
//
// The simulated openreg device executes torch's own CPU kernels on device
// memory: a DispatchStub kernel for openreg calls the stub's CPU entry with the
// same TensorIterator. This is what makes native ops run at CPU speed.
//
// Two things differ from a CPU iterator, and AsCpuIterator fixes both:
// - TensorIteratorBase::compute_types only promotes operands to the common
//   dtype when the common device is CPU (CUDA's kernels cast while loading).
//   CPU kernels assume the operands already have the common dtype, so inputs
//   are cast first and outputs cast back afterwards.
// - The operands' data pointers are device addresses, which CPU code cannot
//   dereference; they are replaced by the addresses kernels use
//   (orKernelAddress).
// It also orders the kernel after the work queued on the current stream.
#pragma once

#include <type_traits>
#include <utility>

#include <ATen/TensorIterator.h>
#include <ATen/native/DispatchStub.h>
#include <c10/util/SmallVector.h>

#include "aten/OpenRegCpuAlias.h"

namespace openreg::native {

// Inputs whose dtype is not the iterator's common dtype are replaced by copies
// in the common dtype; outputs of another dtype (except bool outputs, which
// the CPU comparison kernels write themselves) compute into a temporary that
// write_back() copies into the caller's tensor. Iterators without a common
// dtype keep their dtypes. Every operand then points at kernel addresses.
//
// On a reduction of GRAIN_SIZE elements or more, CPU's kernel builds
// iterators of its own over the operands (the two-pass and per-thread paths
// of TensorIteratorReduce.cpp), so those operands are exchanged for CPU
// aliases (CpuAliases) for the length of the kernel; write_back() or, if the
// kernel threw, the destructor gives the iterator its tensors back and ends
// the aliases. Smaller reductions keep their openreg tensors
// (CpuIterator.cpp, translate).
class AsCpuIterator {
 public:
  explicit AsCpuIterator(at::TensorIteratorBase& iter);
  AsCpuIterator(const AsCpuIterator&) = delete;
  AsCpuIterator& operator=(const AsCpuIterator&) = delete;
  ~AsCpuIterator();
  void write_back();

 private:
  void promote(at::TensorIteratorBase& iter);
  void restore_operands();

  at::TensorIteratorBase& iter_;
  // The iterator's operands exchanged for aliases (borrowed from aliases_).
  c10::SmallVector<int64_t, 2> exchanged_;
  CpuAliases<2> aliases_;

  // (caller's output, temporary in the common dtype). The output operand is
  // not exchanged: TensorIteratorBase::cast_outputs, which CPU's Loops.h calls,
  // would then copy through OperandInfo::original_tensor(), which
  // exchange_tensor does not set on this torch version.
  std::vector<std::pair<at::Tensor, at::Tensor>> outputs_;
};

// Points every operand of `iter` at kernel addresses and orders the kernel
// after the work queued on the current stream.
void use_kernel_addresses(at::TensorIteratorBase& iter);

// The dtypes of AT_ALL_TYPES_AND_COMPLEX, bool, half and bfloat16: those the
// direct loops here (casts, fills) dispatch over.
bool plain_dtype(at::ScalarType dtype);

// Called by the generated structured wrappers between meta() and impl()
// (codegen STRUCTURED_PREPARE). Some CPU impls call their CPU kernel directly
// rather than through the stub (gelu_out_cpu: GeluKernel(kCPU, ...)), so an
// iterator must hold kernel addresses before impl() runs; the stubs impl()
// reaches translate again, which changes nothing.
template <typename Op>
void prepare_structured_impl(Op& op) {
  if constexpr (std::is_base_of_v<at::TensorIteratorBase, Op>) {
    use_kernel_addresses(op);
  }
}

// Iter is TensorIteratorBase or TensorIterator, whichever the stub takes.
template <typename Stub, typename Iter, typename... Args>
void run_cpu_stub(Stub& stub, Iter& iter, Args&&... args) {
  AsCpuIterator cpu_iter(iter);
  stub(c10::DeviceType::CPU, iter, std::forward<Args>(args)...);
  cpu_iter.write_back();
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
