// abs.out: torch's native abs_out is device-generic (it builds a unary
// TensorIterator, real output for complex input, and calls abs_stub), so the
// kernel is torch's own; abs_stub's openreg kernel is the CPU one
// (`cpu_kernel: true` in the yaml). abs and abs_ reach it through their
// CompositeExplicitAutograd kernels.
#include <ATen/ops/abs_native.h>

#include "OpenRegNativeFunctions.h"

namespace openreg::native {

at::Tensor& abs_out(const at::Tensor& self, at::Tensor& out) {
  return at::native::abs_out(self, out);
}

} // namespace openreg::native
