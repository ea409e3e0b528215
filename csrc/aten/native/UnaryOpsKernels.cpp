// openreg kernels for the unary DispatchStubs of ATen/native/UnaryOps.h. The
// structured groups bound in backend_functions.yaml (neg.out, exp.out, ...)
// reach them from torch's impl(); each runs torch's CPU kernel on device memory.
#include "OpenRegNativeFunctions.h"
#include "aten/native/CpuStub.h"

namespace openreg::native {

void neg_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::neg_stub, iter);
}

void exp_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::exp_stub, iter);
}

void sqrt_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::sqrt_stub, iter);
}

void sigmoid_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::sigmoid_stub, iter);
}

void tanh_kernel(at::TensorIteratorBase& iter) {
  run_cpu_stub(at::native::tanh_stub, iter);
}

} // namespace openreg::native
