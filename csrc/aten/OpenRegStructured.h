// The outputs of structured kernels: what the classes in the generated
// RegisterStructured_*.cpp (codegen/emit_structured.py) do when meta() asks
// for an output (set_output_strided / set_output_raw_strided). torchgen writes
// the same helpers into every RegisterDispatchKey.cpp it generates
// (gen_registration_helpers: create_out, resize_out, check_inplace,
// maybe_create_proxy); here they are written once, and the generated units do
// not include ATen/native/Resize.h (which brings ATen/NativeFunctions.h).
#pragma once

#include <optional>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

#include "aten/OpenRegDevice.h"

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
// functional call's path, and out of line it cost 20-40 ns per call in
// benchmarks/bench_ops.py's small cases.
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

} // namespace openreg::structured
