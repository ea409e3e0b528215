#include "operators/OpenRegStructured.h"

#include <ATen/native/Resize.h>

namespace openreg::structured {
namespace {

// out= tensors: same dtype and device, resized if their shape differs; the
// strides the meta function proposes are only applied to a resized tensor.
void resize_out(const at::Tensor& out, at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions& options) {
  TORCH_CHECK(options.dtype() == out.dtype(),
      "Expected out tensor to have dtype ", options.dtype(), ", but got ", out.dtype(), " instead");
  TORCH_CHECK(options.device() == out.device(),
      "Expected out tensor to have device ", options.device(), ", but got ", out.device(), " instead");
  const bool resized = at::native::resize_output(out, sizes);
  if (resized) {
    if (!strides.empty()) {
      TORCH_INTERNAL_ASSERT(!options.memory_format_opt().has_value());
      out.as_strided_(sizes, strides);
    } else if (options.memory_format_opt().has_value()) {
      out.unsafeGetTensorImpl()->empty_tensor_restride(*options.memory_format_opt());
    }
  }
}

// In-place: the result must fit self exactly.
void check_inplace(const at::Tensor& self, at::IntArrayRef sizes, const at::TensorOptions& options) {
  TORCH_CHECK(options.dtype() == self.dtype(),
      "Bad in-place call: input tensor dtype ", self.dtype(), " and output tensor dtype ", options.dtype(), " should match");
  TORCH_CHECK(options.device() == self.device(),
      "Bad in-place call: input tensor device ", self.device(), " and output tensor device ", options.device(), " should match");
  TORCH_CHECK(sizes == self.sizes(),
      "Bad in-place call: input tensor size ", self.sizes(), " and output tensor size ", sizes, " should match");
}

} // namespace

void set_given_output(
    OptionalDeviceGuard& guard, const at::Tensor& out, bool inplace, std::optional<at::Tensor>* proxy,
    at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions& options) {
  select_device(guard, options);
  if (inplace) {
    check_inplace(out, sizes, options);
  } else {
    resize_out(out, sizes, strides, options);
  }
  if (proxy != nullptr && C10_UNLIKELY(out.strides() != strides)) {
    *proxy = create_out(sizes, strides, options);
  }
}

} // namespace openreg::structured
