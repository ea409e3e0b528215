// fill_.Scalar (and so zero_, ones_like, full, ...): torch's own native fill_
// is device-generic; it builds a nullary TensorIterator and calls fill_stub,
// whose openreg kernel is torch's CPU one (`cpu_kernel: true` in the yaml).
#include <ATen/ops/fill_native.h>

#include "OpenRegNativeFunctions.h"

namespace openreg::native {

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  return at::native::fill_(self, value);
}

} // namespace openreg::native
