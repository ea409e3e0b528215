// fill_.Scalar (and so zero_, ones_like, full, ...): torch's own native fill_
// is device-generic; it builds a nullary TensorIterator and calls fill_stub,
// which reaches fill_kernel for openreg tensors.
#include <ATen/ops/fill_native.h>

#include "OpenRegNativeFunctions.h"
#include "aten/native/CpuStub.h"

namespace openreg::native {

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  return at::native::fill_(self, value);
}

void fill_kernel(at::TensorIterator& iter, const c10::Scalar& value) {
  run_cpu_stub(at::native::fill_stub, iter, value);
}

} // namespace openreg::native
