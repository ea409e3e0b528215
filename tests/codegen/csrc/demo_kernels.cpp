// Definitions the codegen looks for when it checks tests/codegen/fixture.yaml.
// Never compiled: only the names, the parameter lists and the include of the
// generated header matter.
#include "OpenRegNativeFunctions.h"

namespace demo::native {

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout, std::optional<at::Device> device,
    std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  return {};
}

at::Tensor view_symint(const at::Tensor& self, c10::SymIntArrayRef size) {
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  return dst;
}

at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, at::Tensor& out) {
  return out;
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return input;
}

void bmm_out(const at::Tensor& self, const at::Tensor& mat2, const at::Tensor& out) {}

void neg_kernel(at::TensorIteratorBase& iter) {}

void fill_kernel(at::TensorIterator& iter, const c10::Scalar& value) {}

void max_kernel(const at::Tensor& result, const at::Tensor& indice, const at::Tensor& self, int64_t dim, bool keepdim) {}

at::Tensor scale(const at::Tensor& self, double factor) {
  return self;
}

at::Tensor scale_meta(const at::Tensor& self, double factor) {
  return self;
}

at::Tensor scale_backward(const at::Tensor& grad, double factor) {
  return grad;
}

at::Tensor norm2(const at::Tensor& self, const std::optional<at::Tensor>& weight) {
  return self;
}

at::Tensor norm2_meta(const at::Tensor& self, const std::optional<at::Tensor>& weight) {
  return self;
}

} // namespace demo::native
