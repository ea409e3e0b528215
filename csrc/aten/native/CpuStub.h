// The simulated openreg device executes torch's own CPU kernels on device
// memory: a DispatchStub kernel for openreg calls the stub's CPU entry with the
// same TensorIterator. This is what makes native ops run at CPU speed.
//
// Two things differ from a CPU iterator, and AsCpuIterator fixes both:
// - TensorIteratorBase::compute_types only promotes operands to the common
//   dtype when the common device is CPU (CUDA's kernels cast while loading).
//   CPU kernels assume the operands already have the common dtype, so inputs
//   are cast first and outputs cast back afterwards.
// - The operands' data pointers are device addresses, which host code cannot
//   dereference; they are replaced by the addresses kernels use
//   (orKernelAddress).
// It also orders the kernel after the work queued on the current stream.
#pragma once

#include <array>
#include <type_traits>
#include <utility>

#include <ATen/TensorIterator.h>
#include <ATen/native/DispatchStub.h>
#include <c10/util/SmallVector.h>

#include "aten/OpenRegHostAlias.h"
#include "aten/OpenRegStream.h"

namespace openreg::native {

// Inputs whose dtype is not the iterator's common dtype are replaced by copies
// in the common dtype; outputs of another dtype (except bool outputs, which
// the CPU comparison kernels write themselves) compute into a temporary that
// write_back() copies into the caller's tensor. Iterators without a common
// dtype keep their dtypes. Every operand then points at kernel addresses.
//
// On a reduction of GRAIN_SIZE elements or more, CPU's kernel builds
// iterators of its own over the operands (the two-pass and per-thread paths
// of TensorIteratorReduce.cpp), so those operands are exchanged for host
// aliases for the length of the kernel: recycled ones (operand_alias), given
// back to the iterator and ended by write_back() or, if the kernel threw, the
// destructor. Smaller reductions keep their openreg tensors (CpuStub.cpp,
// translate).
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

  struct Exchanged {
    int64_t arg;
    c10::StorageImpl* device_storage;
  };
  at::TensorIteratorBase& iter_;
  HostAliasPool* pool_ = nullptr;
  c10::SmallVector<Exchanged, 2> exchanged_;

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

// The operands of a structured group declared `host_impl: true`: CPU's
// impl() runs on host aliases of its tensor arguments, because it calls its
// CPU kernel with kCPU (softmax_cpu_out) or a stub that takes tensors
// (cumsum_stub), which prepare_structured_impl cannot reach. Anything the impl
// computes with runs on CPU tensors, so the result is CPU's. Operands on one
// device storage get aliases sharing one host storage, as HostCall's do, so
// the impl sees the overlap a CPU call would, and a tensor passed twice (an
// in-place call's self and output) gets one alias, so `self.is_same(out)`
// holds as on CPU. The generated wrapper checks first that every tensor is on
// one openreg device; `N` is its number of tensor arguments.
template <size_t N>
class HostImplOperands {
 public:
  explicit HostImplOperands(const at::TensorBase& any) : pool_(host_alias_pool()) {
    join_current_stream(any.device().index());
  }
  HostImplOperands(const HostImplOperands&) = delete;
  HostImplOperands& operator=(const HostImplOperands&) = delete;
  ~HostImplOperands() {
    // Aliases sharing a storage go first, so each storage's first alias is
    // the only one left on it when it ends. One the impl replaced (see
    // check_kept) is not an alias any more: it is only dropped.
    for (size_t i = count_; i-- > 0;) {
      if (operands_[i].first_on_storage && operands_[i].alias.unsafeGetTensorImpl() == operands_[i].made) {
        end_operand_alias(std::move(operands_[i].alias), operands_[i].device_storage, pool_);
      } else {
        operands_[i].alias.reset();
      }
    }
  }

  // After impl(): every alias must still be the tensor handed out, over the
  // operand's memory. An impl that assigned another tensor to its output
  // (through a const_cast) or resized it would leave its result in memory the
  // device tensor never sees; that raises rather than return a wrong result.
  void check_kept(const char* op) const {
    for (size_t i = 0; i < count_; ++i) {
      const Operand& o = operands_[i];
      TORCH_CHECK(
          o.alias.unsafeGetTensorImpl() == o.made &&
              o.made->storage().unsafeGetStorageImpl()->data_ptr().get() == o.kernel_address,
          op, ": CPU's impl() replaced or resized the host alias of an operand, so its result cannot reach the "
          "openreg tensor. This is an openreg bug: bind the operator under cpu_kernels instead of host_impl.");
    }
  }

  // The alias of a device tensor; an undefined tensor as it is.
  const at::Tensor& operator()(const at::Tensor& t) {
    if (!t.defined()) {
      return t;
    }
    for (size_t i = 0; i < count_; ++i) {
      if (operands_[i].device_tensor == t.unsafeGetTensorImpl()) {
        return operands_[i].alias;
      }
    }
    TORCH_INTERNAL_ASSERT(count_ < N && t.device().is_privateuseone());
    c10::StorageImpl* device_storage = t.storage().unsafeGetStorageImpl();
    Operand& operand = operands_[count_++];
    operand.device_tensor = t.unsafeGetTensorImpl();
    operand.device_storage = device_storage;
    for (size_t i = 0; i + 1 < count_; ++i) {
      if (operands_[i].first_on_storage && operands_[i].device_storage == device_storage) {
        operand.alias = host_alias(t, operands_[i].alias.storage());
        operand.made = operand.alias.unsafeGetTensorImpl();
        operand.kernel_address = operands_[i].kernel_address;
        operand.first_on_storage = false;
        return operand.alias;
      }
    }
    operand.alias = operand_alias(t, pool_);
    operand.made = operand.alias.unsafeGetTensorImpl();
    operand.kernel_address = operand.made->storage().unsafeGetStorageImpl()->data_ptr().get();
    operand.first_on_storage = true;
    return operand.alias;
  }

 private:
  struct Operand {
    at::Tensor alias;
    const c10::TensorImpl* device_tensor = nullptr;
    const c10::TensorImpl* made = nullptr; // the alias handed out
    const void* kernel_address = nullptr; // where its storage's bytes start
    c10::StorageImpl* device_storage = nullptr;
    bool first_on_storage = false;
  };
  HostAliasPool& pool_;
  std::array<Operand, N> operands_;
  size_t count_ = 0;
};

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
