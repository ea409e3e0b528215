// openreg kernels for reduction DispatchStubs that do not take a
// TensorIterator (the ones that do run through `cpu_kernel: true`), and sum's
// impl().
#include <ATen/native/ReduceOps.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>

#include "OpenRegNativeFunctions.h"
#include "operators/OpenRegLaunch.h"

namespace openreg::native {

// max.dim's structured impl calls max_stub with tensors rather than an
// iterator; torch's CPU kernel, launched, builds its own iterator over CPU
// tensors at the device tensors' kernel addresses. The operands all have the
// same dtype, so no promotion is needed.
void max_kernel(
    const at::Tensor& values,
    const at::Tensor& indices,
    const at::Tensor& self,
    int64_t dim,
    bool keepdim) {
  static SeenDtypes seen;
  launch_operands_kernel<kCpuTensors>(
      self.device().index(), "at::native::max_stub", seen,
      std::array<const at::TensorBase*, 3>{&values, &indices, &self}, [dim, keepdim](auto& t) {
        at::native::max_stub(c10::DeviceType::CPU, t[0], t[1], t[2], dim, keepdim);
      });
}

// sum's impl() (`structured: impl: sum_out`): CPU's (ReduceOps.cpp,
// TORCH_IMPL_FUNC(sum_out)), whose test for its float accumulation buffer
// (should_use_acc_buffer) asks `iter.device().is_cpu()`. The buffer is how CPU
// sums half and bfloat16 over two reduced dimensions the iterator could not
// coalesce (pytorch#83149): without it, the kernel rounds each row's partial
// sum to the output's dtype, and a strided half sum came out 1 ulp from CPU's.
// The simulated device runs CPU's kernel, so it takes CPU's buffer too.
void sum_out(
    const at::Tensor& self,
    at::OptionalIntArrayRef dim,
    bool keepdim,
    std::optional<at::ScalarType> /*dtype*/,
    const at::Tensor& out) {
  auto iter = at::meta::make_reduction_from_out_ty(self, out, dim, keepdim, out.scalar_type());
  if (iter.numel() == 0) {
    out.zero_();
    return;
  }
  const bool reduces_two_dims_in_reduced_float = iter.noutputs() == 1 &&
      at::isReducedFloatingType(iter.common_dtype()) && iter.ndim() >= 2 && iter.strides(0)[0] == 0 &&
      iter.strides(0)[1] == 0;
  if (reduces_two_dims_in_reduced_float) {
    at::Tensor buffer = at::empty(out.sizes(), out.options().dtype(at::kFloat));
    at::sum_outf(self.to(at::kFloat), dim, keepdim, /*dtype=*/std::nullopt, buffer);
    out.copy_(buffer);
    return;
  }
  at::native::sum_stub(iter.device_type(), iter);
}

} // namespace openreg::native
