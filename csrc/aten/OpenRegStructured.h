// The structured glue: the classes the wrappers in the generated
// RegisterStructured_*.cpp (codegen/emit/structured.py) run meta() and impl()
// on, what they do when meta() asks for an output (set_output_strided /
// set_output_raw_strided), and the operands of a CPU impl() run on CPU
// aliases (CpuImplOperands). torchgen writes
// the same helpers into every RegisterDispatchKey.cpp it generates
// (gen_registration_helpers: create_out, resize_out, check_inplace,
// maybe_create_proxy); here they are written once, and the generated units do
// not include ATen/native/Resize.h (which brings ATen/NativeFunctions.h).
#pragma once

#include <array>
#include <functional>
#include <optional>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

#include "aten/OpenRegCpuAlias.h"
#include "aten/OpenRegDevice.h"
#include "aten/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::structured {

// The class's guard follows the first output's device; all outputs must be on it.
inline void select_device(OptionalDeviceGuard& guard, const at::TensorOptions& options) {
  const auto current_device = guard.current_device();
  if (C10_UNLIKELY(current_device.has_value())) {
    TORCH_INTERNAL_ASSERT(*current_device == options.device(), "structured kernels don't support multi-device outputs");
  } else {
    guard.reset_device(options.device());
  }
}

// A new tensor on the current openreg device, from the PrivateUse1 allocator
// without a trip through the dispatcher (as CPU's at::detail::empty_cpu).
inline at::Tensor create_out(at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions& options) {
  c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  if (strides.empty()) {
    return at::detail::empty_generic(sizes, allocator, keys, dtype, options.memory_format_opt());
  }
  return at::detail::empty_strided_generic(sizes, strides, allocator, keys, dtype);
}

// A functional operator's output: allocated on openreg, on the device of the
// first output (made current by `guard` until the wrapper returns; every
// output must be on that device). Inline, as create_out: it is on every
// functional call's path, where a call out of line showed in
// benchmarks/bench_ops.py's small cases (docs/performance.md).
inline void set_new_output(
    OptionalDeviceGuard& guard, at::Tensor& output, at::IntArrayRef sizes, at::IntArrayRef strides,
    const at::TensorOptions& options) {
  select_device(guard, options);
  output = create_out(sizes, strides, options);
}

// An out= or in-place operator's output, the caller's tensor: resized (out=)
// or checked to fit exactly (in-place). With `proxy`, a tensor whose strides
// differ from the ones the kernel asks for gets a temporary in *proxy, which
// the wrapper copies back after impl().
void set_given_output(
    OptionalDeviceGuard& guard, const at::Tensor& out, bool inplace, std::optional<at::Tensor>* proxy,
    at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions& options);

// The object a functional wrapper runs meta() and impl() on: `Parent` is the
// structured class whose meta() (and impl()) run, CPU's or torch's meta class;
// each of the N outputs meta() asks for is allocated on openreg. With
// kParentSetsOutput (the group's structured_inherits, TensorIteratorBase),
// the parent's own set_output_raw_strided runs afterwards, so it sees the
// output through maybe_get_output.
template <class Parent, size_t N, bool kParentSetsOutput>
struct FunctionalOp final : public Parent {
  void set_output_strided(
      int64_t output_idx, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options) override {
    set_output_raw_strided(output_idx, sizes, strides, options);
  }
  void set_output_raw_strided(
      int64_t output_idx, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options) override {
    set_new_output(guard_, outputs_[output_idx], sizes, strides, options);
    if constexpr (kParentSetsOutput) {
      Parent::set_output_raw_strided(output_idx, sizes, strides, options);
    }
  }
  const at::Tensor& maybe_get_output(int64_t output_idx) override {
    return outputs_[output_idx];
  }
  std::array<at::Tensor, N> outputs_;
  OptionalDeviceGuard guard_;
};

// The object an out= (kInplace false) or in-place wrapper runs meta() and
// impl() on: the outputs are the caller's tensors, resized (out=) or checked
// (in-place) by set_given_output. Where the caller's strides differ from the
// ones the kernel asks for (set_output_strided), the kernel writes a proxy
// that copy_back() copies into the caller's tensor after impl().
template <class Parent, size_t N, bool kInplace, bool kParentSetsOutput>
struct GivenOutputsOp final : public Parent {
  template <typename... Outputs>
  explicit GivenOutputsOp(Outputs&... outputs) : outputs_{std::ref(outputs)...} {
    static_assert(sizeof...(Outputs) == N);
  }
  void set_output_strided(
      int64_t output_idx, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options) override {
    set_given_output(guard_, outputs_[output_idx].get(), kInplace, &proxy_outputs_[output_idx], sizes, strides, options);
    set_parent_output(output_idx, sizes, strides, options);
  }
  void set_output_raw_strided(
      int64_t output_idx, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options) override {
    set_given_output(guard_, outputs_[output_idx].get(), kInplace, nullptr, sizes, strides, options);
    set_parent_output(output_idx, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t output_idx) override {
    return proxy_outputs_[output_idx].has_value() ? *proxy_outputs_[output_idx] : outputs_[output_idx].get();
  }
  void copy_back() {
    for (size_t i = 0; i < N; ++i) {
      if (proxy_outputs_[i].has_value()) {
        outputs_[i].get().copy_(*proxy_outputs_[i]);
      }
    }
  }
  std::array<std::reference_wrapper<at::Tensor>, N> outputs_;
  std::array<std::optional<at::Tensor>, N> proxy_outputs_;
  OptionalDeviceGuard guard_;

 private:
  void set_parent_output(
      int64_t output_idx, at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions& options) {
    if constexpr (kParentSetsOutput) {
      Parent::set_output_raw_strided(output_idx, sizes, strides, options);
    }
  }
};

template <class Parent, size_t N, bool kParentSetsOutput>
using OutOp = GivenOutputsOp<Parent, N, /*kInplace=*/false, kParentSetsOutput>;
template <class Parent, bool kParentSetsOutput>
using InplaceOp = GivenOutputsOp<Parent, 1, /*kInplace=*/true, kParentSetsOutput>;

// The operands of a structured group declared `on_cpu_aliases: true`: CPU's
// impl() runs on CPU aliases of its tensor arguments, because it calls its
// CPU kernel with kCPU (softmax_cpu_out) or a stub that takes tensors
// (cumsum_stub), which prepare_structured_impl (native/CpuIterator.h) cannot
// reach. Anything the impl computes with runs on CPU tensors, so the result is
// CPU's. The aliases are CpuAliases': the impl sees the overlap a CPU call
// would, and a tensor passed twice (an in-place call's self and output) gets
// one alias, so `self.is_same(out)` holds as on CPU. The generated wrapper
// checks first that every tensor is on one openreg device; `N` is its number
// of tensor arguments.
template <size_t N>
class CpuImplOperands {
 public:
  explicit CpuImplOperands(const at::TensorBase& any) {
    join_current_stream(any.device().index());
  }

  // After impl(): every alias must still be the tensor handed out, over the
  // operand's memory. An impl that assigned another tensor to its output
  // (through a const_cast) or resized it would leave its result in memory the
  // device tensor never sees; that raises rather than return a wrong result.
  void check_kept(const char* op) const {
    aliases_.for_each([&](const auto& e) {
      TORCH_CHECK(
          e.alias.unsafeGetTensorImpl() == e.made &&
              e.made->storage().unsafeGetStorageImpl()->data_ptr().get() ==
                  orKernelAddress(e.device_storage->data_ptr().get()),
          op, ": CPU's impl() replaced or resized the CPU alias of an operand, so its result cannot reach the "
          "openreg tensor. This is an openreg bug: bind the operator under cpu_kernels instead of on_cpu_aliases.");
    });
  }

  // The alias of a device tensor; an undefined tensor as it is.
  const at::Tensor& operator()(const at::Tensor& t) {
    if (!t.defined()) {
      return t;
    }
    TORCH_INTERNAL_ASSERT(t.device().is_privateuseone());
    return aliases_.get(t).first->alias;
  }

 private:
  CpuAliases<N> aliases_;
};

} // namespace openreg::structured
