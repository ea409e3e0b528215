// The structured glue: the classes the wrappers in the generated
// RegisterStructured_*.cpp (codegen/emit/structured.py) run meta() and impl()
// on, and what they do when meta() asks for an output (set_output_strided /
// set_output_raw_strided). torchgen writes
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

#include "operators/cpu/OpenRegCpuAlias.h"
#include "device/OpenRegDevice.h"
#include "device/OpenRegStream.h"
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

} // namespace openreg::structured
