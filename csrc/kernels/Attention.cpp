// Fused scaled dot product attention through the route torch keeps for
// PrivateUse1 backends (aten/src/ATen/native/transformers/attention.cpp):
// scaled_dot_product_attention asks `_fused_sdp_choice_stub` of the query's
// device which backend to run; `SDPBackend::overrideable` sends the call to
// `_scaled_dot_product_fused_attention_overrideable`, whose autograd formula
// (derivatives.yaml) calls `..._overrideable_backward`.
//
// The simulated device's fused kernel is CPU's flash attention run on the
// device memory, so openreg picks it exactly where CPU picks its own (CPU's
// choice function, which honours `torch.nn.attention.sdpa_kernel` and the
// `torch.backends.cuda.enable_*_sdp` flags, as on CPU: MATH and
// FLASH_ATTENTION select), and the results have CPU's bits. Everything else
// (dropout, an attention mask that needs a gradient, shapes flash refuses)
// takes torch's math path on the device, as on CPU; dropout there draws from
// the device's generator (native_dropout, Dropout.cpp).
//
// Both kernels run like the `cpu_kernels` route's: at once for a small call
// on an idle stream, else queued on the stream through CPU's operator
// (launch_cpu_kernel, OpenRegBoxedCpuKernel.h), whose results' geometry the
// first call of each shape learns. CPU's forward operator is tagged as
// drawing random numbers (its dropout_p), which is never queued; without
// dropout it draws none. The gradient of an additive mask, which only a direct
// call of the backward asks for, is computed with device operators.
#include <cmath>
#include <limits>

#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_cpu_dispatch.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_cpu_dispatch.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>

#include "OpenRegNativeFunctions.h"
#include "operators/cpu/OpenRegBoxedCpuKernel.h"
#include "operators/cpu/OpenRegCpuKernelCall.h"

namespace openreg::native {

int64_t fused_sdp_choice(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask,
    double dropout_p,
    bool is_causal,
    std::optional<double> scale,
    bool enable_gqa) {
  // CPU's choice reads only shapes, strides, dtypes, requires_grad and the
  // global flags, never memory, so it runs on the device tensors themselves.
  const auto cpu_choice = static_cast<at::SDPBackend>(
      at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa));
  const auto choice = cpu_choice == at::SDPBackend::flash_attention ? at::SDPBackend::overrideable : cpu_choice;
  return static_cast<int64_t>(choice);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
scaled_dot_product_fused_attention_overrideable(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_bias,
    double dropout_p,
    bool is_causal,
    bool return_debug_mask,
    std::optional<double> scale) {
  TORCH_CHECK(
      !return_debug_mask,
      "_scaled_dot_product_fused_attention_overrideable on openreg: return_debug_mask=True is not supported "
      "(the kernel is CPU's flash attention, which has no debug mask)");
  CpuKernelCall call("aten::_scaled_dot_product_fused_attention_overrideable");
  call.note(query, "query");
  call.note(key, "key");
  call.note(value, "value");
  call.note(attn_bias, "attn_bias");
  // The sequence lengths of the variable-length (nested) form are not used by a
  // kernel without nested inputs: undefined tensors, as the Meta kernel
  // (torch/_meta_registrations.py) returns Nones. The dropout seed and offset
  // are unused too, but the Meta kernel returns tensors, which a compiled graph
  // saves for the backward: CPU tensors, as CUDA's flash attention returns them.
  auto results = [&](at::Tensor output, at::Tensor logsumexp) {
    return std::make_tuple(
        std::move(output),
        std::move(logsumexp),
        at::Tensor(),
        at::Tensor(),
        query.sym_size(-2),
        key.sym_size(-2),
        at::empty({}, at::kLong),
        at::empty({}, at::kLong),
        at::Tensor());
  };
  if (dropout_p == 0 && call.may_queue()) {
    using Forward = at::_ops::_scaled_dot_product_flash_attention_for_cpu;
    static const c10::OperatorHandle op = cpu_kernel_operator(Forward::name, Forward::overload_name);
    auto [output, logsumexp] = launch_cpu_kernel<Forward::schema, Draws::kNone>(
        op, query, key, value, dropout_p, is_causal, attn_bias, scale);
    return results(std::move(output), std::move(logsumexp));
  }
  call.begin();
  // CPU's kernel checks the rest (4-D inputs, no dropout, dtypes) with its own messages.
  auto [output, logsumexp] = at::cpu::_scaled_dot_product_flash_attention_for_cpu(
      call.alias(query), call.alias(key), call.alias(value), dropout_p, is_causal, call.alias(attn_bias), scale);
  call.finish();
  return results(call.result(std::move(output)), call.result(std::move(logsumexp)));
}

namespace {

// The gradient of an additive attn_bias, which CPU's flash attention does not
// compute: that of the scores it is added to, dS = P * (dP - rowsum(dP * P))
// with P = softmax(scores) and dP = grad_out @ value^T, summed over the
// dimensions attn_bias was broadcast in. Device operators, in float for
// reduced precision inputs.
at::Tensor attn_bias_grad(
    const at::Tensor& grad_out,
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const at::Tensor& attn_bias,
    bool is_causal,
    std::optional<double> scale) {
  TORCH_CHECK(
      attn_bias.defined() && attn_bias.is_floating_point(),
      "_scaled_dot_product_fused_attention_overrideable_backward: grad_input_mask[3] asks for the gradient of "
      "attn_bias, which needs a floating point attn_bias (got ",
      attn_bias.defined() ? c10::toString(attn_bias.scalar_type()) : "none", ")");
  const at::ScalarType compute = at::isReducedFloatingType(query.scalar_type()) ? at::kFloat : query.scalar_type();
  const double scale_factor = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
  at::Tensor scores = at::matmul(query.to(compute), key.to(compute).transpose(-2, -1));
  scores.mul_(scale_factor).add_(attn_bias.to(compute));
  if (is_causal) {
    const at::Tensor keep = at::ones({query.size(-2), key.size(-2)}, query.options().dtype(at::kBool)).tril();
    scores.masked_fill_(keep.logical_not(), -std::numeric_limits<double>::infinity());
  }
  const at::Tensor probs = at::softmax(scores, -1);
  const at::Tensor dprobs = at::matmul(grad_out.to(compute), value.to(compute).transpose(-2, -1));
  const at::Tensor dscores = probs.mul(dprobs.sub(dprobs.mul(probs).sum(-1, /*keepdim=*/true)));
  return at::sum_to(dscores, attn_bias.sizes()).to(attn_bias.scalar_type());
}

} // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> scaled_dot_product_fused_attention_overrideable_backward(
    const at::Tensor& grad_out,
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const at::Tensor& attn_bias,
    std::array<bool, 4> grad_input_mask,
    const at::Tensor& out,
    const at::Tensor& logsumexp,
    const at::Tensor& /*cum_seq_q*/,
    const at::Tensor& /*cum_seq_k*/,
    int64_t /*max_q*/,
    int64_t /*max_k*/,
    double dropout_p,
    bool is_causal,
    const at::Tensor& /*philox_seed*/,
    const at::Tensor& /*philox_offset*/,
    std::optional<double> scale) {
  // fused_sdp_choice never picks this route for a mask that needs a gradient
  // (CPU's choice takes the math path then); a direct call may ask for it.
  at::Tensor grad_attn_bias =
      grad_input_mask[3] ? attn_bias_grad(grad_out, query, key, value, attn_bias, is_causal, scale) : at::Tensor();
  const std::optional<at::Tensor> mask = attn_bias.defined() ? std::optional<at::Tensor>(attn_bias) : std::nullopt;
  CpuKernelCall call("aten::_scaled_dot_product_fused_attention_overrideable_backward");
  call.note(grad_out, "grad_out");
  call.note(query, "query");
  call.note(key, "key");
  call.note(value, "value");
  call.note(mask, "attn_bias");
  call.note(out, "out");
  call.note(logsumexp, "logsumexp");
  auto results = [&](at::Tensor grad_query, at::Tensor grad_key, at::Tensor grad_value) {
    return std::make_tuple(
        grad_input_mask[0] ? std::move(grad_query) : at::Tensor(),
        grad_input_mask[1] ? std::move(grad_key) : at::Tensor(),
        grad_input_mask[2] ? std::move(grad_value) : at::Tensor(),
        std::move(grad_attn_bias));
  };
  if (call.may_queue()) {
    using Backward = at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward;
    static const c10::OperatorHandle op = cpu_kernel_operator(Backward::name, Backward::overload_name);
    auto [grad_query, grad_key, grad_value] = launch_cpu_kernel<Backward::schema>(
        op, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, mask, scale);
    return results(std::move(grad_query), std::move(grad_key), std::move(grad_value));
  }
  call.begin();
  auto [grad_query, grad_key, grad_value] = at::cpu::_scaled_dot_product_flash_attention_for_cpu_backward(
      call.alias(grad_out),
      call.alias(query),
      call.alias(key),
      call.alias(value),
      call.alias(out),
      call.alias(logsumexp),
      dropout_p,
      is_causal,
      call.alias(mask),
      scale);
  call.finish();
  return results(
      call.result(std::move(grad_query)), call.result(std::move(grad_key)), call.result(std::move(grad_value)));
}

} // namespace openreg::native
