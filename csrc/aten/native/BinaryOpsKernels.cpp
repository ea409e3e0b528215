// openreg kernels for the binary DispatchStubs of ATen/native/BinaryOps.h and
// Pow.h. add_stub serves both add.out and sub.out (sub passes -alpha).
#include "OpenRegNativeFunctions.h"
#include "aten/native/CpuStub.h"

namespace openreg::native {

void add_kernel(at::TensorIteratorBase& iter, const at::Scalar& alpha) {
  run_cpu_stub(at::native::add_stub, iter, alpha);
}

void mul_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::mul_stub, iter);
}

void div_true_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::div_true_stub, iter);
}

void maximum_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::maximum_stub, iter);
}

void minimum_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::minimum_stub, iter);
}

void heaviside_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::heaviside_stub, iter);
}

void eq_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::eq_stub, iter);
}

void lt_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::lt_stub, iter);
}

void pow_tensor_tensor_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::pow_tensor_tensor_stub, iter);
}

} // namespace openreg::native
