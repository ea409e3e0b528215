// openreg kernels for reduction DispatchStubs that do not take a
// TensorIterator (the ones that do run through `cpu_kernel: true`).
#include "OpenRegNativeFunctions.h"
#include "aten/OpenRegHostAlias.h"
#include "aten/OpenRegStream.h"

namespace openreg::native {

// max.dim's structured impl calls max_stub with tensors rather than an
// iterator; torch's CPU kernel builds its own iterator over host aliases of
// the device tensors. The operands all have the same dtype, so no promotion
// is needed.
void max_kernel(
    const at::Tensor& values,
    const at::Tensor& indices,
    const at::Tensor& self,
    int64_t dim,
    bool keepdim) {
  join_current_stream(self.device().index());
  ScopedHostAlias host_values(values);
  ScopedHostAlias host_indices(indices);
  ScopedHostAlias host_self(self);
  at::native::max_stub(c10::DeviceType::CPU, host_values.get(), host_indices.get(), host_self.get(), dim, keepdim);
}

} // namespace openreg::native
