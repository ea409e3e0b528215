// native_dropout and native_dropout_backward: what F.dropout calls on a
// PrivateUse1 tensor in training (Dropout.cpp: is_fused_kernel_acceptable), as
// on CUDA; on CPU tensors dropout runs a composite instead.
//
// CPU's native_dropout (native_dropout_cpu) draws a bool mask with bernoulli_
// and returns input.mul(mask).mul_(scale): two passes over memory, a cast of
// the mask and a wrapped scalar. These kernels draw the same mask (bernoulli_
// on the device, so from the device's generator and, for the same seed, the
// numbers CPU draws) and apply it in one pass, as a backend writes a fused
// kernel: a TensorIterator plus Loops.h, built for the baseline CPU capability.
//
// The result has CPU's bits. For a kept element CPU computes (x * 1) * s =
// x * s, for a dropped one (x * 0) * s, which is x * 0 (a signed zero, or NaN
// for inf and NaN) since s is finite and not negative, and x * 1 is exact: so
// out = x * (m ? s : 0), one IEEE multiply in float or double. Half and
// bfloat16 take CPU's implementation on the device tensors, as do complex
// and integer dtypes and the eval-mode call: CPU rounds their scale to the
// element type and its vectorized conversions write NaN with other bits than
// the scalar ones, which a loop over a bool mask cannot reproduce.
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include <cmath>

#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/cpu/Loops.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/native_dropout_backward_native.h>
#include <ATen/ops/native_dropout_native.h>

#include "OpenRegNativeFunctions.h"
#include "kernels/CpuIterator.h"

namespace openreg::native {
namespace {

bool fusable(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble;
}

// x * (mask ? scale : 0), broadcast like a binary operator, in x's dtype.
at::Tensor masked_scale(const at::Tensor& x, const at::Tensor& mask, double scale) {
  at::Tensor out;
  auto iter = at::TensorIteratorConfig()
                  .add_output(out)
                  .add_const_input(x)
                  .add_const_input(mask)
                  .check_all_same_dtype(false)
                  .declare_static_dtype(x.scalar_type())
                  .build();
  // No promotion: the loop reads the bool mask as bool. The launch takes the
  // iterator's operands (KernelIterator): the output is kept first.
  at::Tensor result = iter.output();
  static SeenDtypes seen;
  launch_iterator_kernel(iter, seen, "openreg::native::masked_scale", [scale](at::TensorIteratorBase& it) {
    use_kernel_addresses(it);
    AT_DISPATCH_FLOATING_TYPES(it.dtype(0), "openreg::native_dropout", [&] {
      const auto s = static_cast<scalar_t>(scale);
      at::native::cpu_kernel(it, [s](scalar_t v, bool m) -> scalar_t { return v * (m ? s : scalar_t(0)); });
    });
  });
  return result;
}

} // namespace

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0 || (train.has_value() && !*train) || !fusable(input.scalar_type())) {
    return at::native::native_dropout_cpu(input, p, train);
  }
  const double p1m = 1. - p;
  // As CPU: a zero keep-probability gives a zero scale rather than inf.
  const double scale = p1m == 0 ? 0. : 1. / p1m;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(p1m);
  return {masked_scale(input, mask, scale), mask};
}

at::Tensor native_dropout_backward(const at::Tensor& grad_output, const at::Tensor& mask, double scale) {
  // CPU computes grad_output * mask * scale; with a bool mask, as above.
  if (mask.scalar_type() != at::kBool || !fusable(grad_output.scalar_type()) || !std::isfinite(scale) || scale < 0) {
    return at::native::native_dropout_backward(grad_output, mask, scale);
  }
  return masked_scale(grad_output, mask, scale);
}

} // namespace openreg::native
