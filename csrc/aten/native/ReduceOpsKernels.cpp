// openreg kernels for the reduction DispatchStubs of ATen/native/ReduceOps.h.
#include "OpenRegNativeFunctions.h"
#include "aten/native/CpuStub.h"

namespace openreg::native {

void sum_kernel(at::TensorIterator& iter) {
  run_cpu_stub(at::native::sum_stub, iter);
}

} // namespace openreg::native
