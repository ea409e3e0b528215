// Automatic mixed precision for openreg: torch.autocast("openreg", ...).
//
// Autocast is a dispatch key in front of the backend (AutocastPrivateUse1).
// An operator with a kernel there casts its floating-point tensor arguments by
// the operator's policy and redispatches below autocast; every other operator
// falls through. The policy is CUDA's: torch keeps the operator lists in
// ATen/autocast_mode.h so that backends share them, and this file registers
// them for PrivateUse1 the way aten/src/ATen/autocast_mode.cpp does for CUDA:
//   lower_precision_fp  run in the autocast dtype (mm, linear, conv, matmul, ...)
//   fp32                run in float32 (softmax-like, norms, losses, exp/log, ...)
//   fp32_set_opt_dtype  run in float32 unless the caller passed a dtype
//   fp32_append_dtype   norm: redispatch with dtype=float32 appended
//   promote             run in the widest floating type among the arguments
// The dtypes autocast accepts for the device come from
// torch.openreg.get_amp_supported_dtype() (Python).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

// AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE spells its signatures as ATen's own
// sources do, without namespaces.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// binary_cross_entropy is unsafe to autocast (CUDA bans it the same way):
// its float16 result can overflow. The message names the safe alternative.
at::Tensor binary_cross_entropy_banned(
    const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(
      false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast "
      "on openreg: their inputs are often float16 probabilities whose log underflows. Use "
      "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, "
      "which combine the sigmoid and the loss and are safe under autocast.");
}

} // namespace

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define OPENREG_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(OPENREG_LOWER_PRECISION_FP)
#undef OPENREG_LOWER_PRECISION_FP

#define OPENREG_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(OPENREG_FP32)
#undef OPENREG_FP32

#define OPENREG_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(OPENREG_FP32_SET_OPT_DTYPE)
#undef OPENREG_FP32_SET_OPT_DTYPE

  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

#define OPENREG_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(OPENREG_PROMOTE)
#undef OPENREG_PROMOTE

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_banned));
}
