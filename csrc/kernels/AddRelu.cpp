// openreg::add_relu, a custom operator declared in backend_functions.yaml:
// relu(self + alpha * other) in one pass over memory, with broadcasting and
// type promotion like torch.add. Its backward, openreg::add_relu_backward, is
// a custom operator too; the generated autograd function connects them.
//
// The forward kernel is written the way a backend writes its own elementwise
// kernel: a TensorIterator built in the calling thread (its checks, type
// promotion and output allocation raise and happen at the call), then the
// loop launched on the current stream (launch_iterator_kernel), where
// Loops.h's cpu_kernel_vec runs over the device memory's kernel addresses.
// Loops.h compiles per CPU capability; this file is built for the baseline one.
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include <ATen/Dispatch.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/cpu/Loops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/result_type.h>

#include "OpenRegNativeFunctions.h"
#include "kernels/CpuIterator.h"

namespace openreg::native {

at::Tensor add_relu(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  at::Tensor result;
  auto iter = at::TensorIteratorConfig()
                  .add_output(result)
                  .add_const_input(self)
                  .add_const_input(other)
                  .promote_inputs_to_common_dtype(true)
                  .cast_common_dtype_to_outputs(true)
                  .enforce_safe_casting_to_output(true)
                  .build();
  TORCH_CHECK(
      iter.common_dtype() != at::kBool && !at::isComplexType(iter.common_dtype()),
      "openreg::add_relu: expected real, non-bool inputs, got ", self.scalar_type(), " and ", other.scalar_type());
  static SeenDtypes seen;
  launch_iterator_kernel(iter, seen, "openreg::add_relu", [alpha](at::TensorIterator& it) {
    // Inputs cast to the common dtype, operands at kernel addresses: what
    // CPU's loops expect (a CPU iterator casts its inputs when built).
    AsCpuIterator cpu_iter(it);
    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, it.common_dtype(), "openreg::add_relu", [&] {
      using Vec = at::vec::Vectorized<scalar_t>;
      const auto a = alpha.to<scalar_t>();
      const Vec a_vec(a);
      const Vec zero(scalar_t(0));
      at::native::cpu_kernel_vec(
          it,
          [=](scalar_t x, scalar_t y) -> scalar_t {
            const scalar_t sum = x + a * y;
            return sum > scalar_t(0) ? sum : scalar_t(0);
          },
          [=](Vec x, Vec y) { return at::vec::maximum(x + a_vec * y, zero); });
    });
    cpu_iter.write_back();
  });
  return iter.output();
}

at::Tensor add_relu_meta(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  (void)alpha;
  const auto dtype = at::result_type(self, other);
  TORCH_CHECK(
      dtype != at::kBool && !at::isComplexType(dtype),
      "openreg::add_relu: expected real, non-bool inputs, got ", self.scalar_type(), " and ", other.scalar_type());
  return at::empty_symint(
      at::infer_size_symdimvector(self.sym_sizes(), other.sym_sizes()), self.options().dtype(dtype));
}

// The gradient flows where the result is positive; each input's share is
// summed over the dimensions it was broadcast along. Written with ATen ops, so
// it serves as both the device kernel and the Meta kernel.
std::tuple<at::Tensor, at::Tensor> add_relu_backward(
    const at::Tensor& grad,
    const at::Tensor& result,
    const at::Tensor& self,
    const at::Tensor& other,
    const at::Scalar& alpha) {
  const at::Tensor masked = at::mul(grad, at::gt(result, 0));
  return {
      masked.sum_to_size_symint(self.sym_sizes()).to(self.scalar_type()),
      at::mul(masked, alpha).sum_to_size_symint(other.sym_sizes()).to(other.scalar_type())};
}

} // namespace openreg::native
