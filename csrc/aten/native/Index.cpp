// index_stub (advanced indexing, `x[indices]`), behind torch's structured
// index_out, whose meta() builds the iterator: output, the source restrided
// to 0-stride over the indexed dimensions, then the int64 index tensors.
//
// The operands have different dtypes on purpose, but the iterator still
// reports a common dtype, so the generic `cpu_kernel: true` route
// (AsCpuIterator) would cast the indices to the source's dtype. Here only the
// addresses change before torch's CPU kernel runs.
#include <ATen/native/IndexKernel.h>

#include "OpenRegNativeFunctions.h"
#include "aten/native/CpuStub.h"

namespace openreg::native {

void index_kernel(at::TensorIteratorBase& iter, at::IntArrayRef index_size, at::IntArrayRef index_stride) {
  use_kernel_addresses(iter);
  at::native::index_stub(c10::DeviceType::CPU, iter, index_size, index_stride);
}

} // namespace openreg::native
