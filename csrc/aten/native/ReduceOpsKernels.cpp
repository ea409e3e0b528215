// openreg kernels for reduction DispatchStubs that do not take a
// TensorIterator (the ones that do run through `cpu_kernel: true`).
#include "OpenRegNativeFunctions.h"

namespace openreg::native {

// max.dim's structured impl calls max_stub with tensors rather than an
// iterator; torch's CPU kernel builds its own iterator over device memory,
// whose operands all have the same dtype, so no promotion is needed.
void max_kernel(
    const at::Tensor& values,
    const at::Tensor& indices,
    const at::Tensor& self,
    int64_t dim,
    bool keepdim) {
  at::native::max_stub(c10::DeviceType::CPU, values, indices, self, dim, keepdim);
}

} // namespace openreg::native
