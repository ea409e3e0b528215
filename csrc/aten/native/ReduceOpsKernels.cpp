// openreg kernels for the reduction DispatchStubs of ATen/native/ReduceOps.h
// and TensorCompare.h.
#include "OpenRegNativeFunctions.h"
#include "aten/native/CpuStub.h"

namespace openreg::native {

void sum_kernel(at::TensorIterator& iter) {
  run_cpu_stub(at::native::sum_stub, iter);
}

// max.dim's structured impl calls max_stub with tensors rather than an
// iterator; torch's CPU kernel builds its own iterator over device memory.
void max_kernel(
    const at::Tensor& values,
    const at::Tensor& indices,
    const at::Tensor& self,
    int64_t dim,
    bool keepdim) {
  at::native::max_stub(c10::DeviceType::CPU, values, indices, self, dim, keepdim);
}

} // namespace openreg::native
