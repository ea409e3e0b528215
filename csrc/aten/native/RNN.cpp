// The fused LSTM and GRU cells that torch's RNN code calls for PrivateUse1
// tensors (aten/src/ATen/native/RNN.cpp: LSTMCell and GRUCell take
// `_thnn_fused_*_cell` when `input.is_privateuseone()`, as for CUDA), and
// their backward functions (derivatives.yaml). CPU has no kernel for them, so
// without these nn.LSTM, nn.GRU and their cells cannot run on openreg at all.
//
// The forward cells run the device's elementwise operators in the order of
// CPU's unfused cell (same operators, same rounding), so their results are
// CPU's whenever CPU's `linear` (addmm with the bias) rounds as the fused
// path's matmul plus a bias add does. The workspace keeps what the backward
// needs, in CUDA's layout: the LSTM's four activated gates; the GRU's reset,
// update and new gates, the hidden state and the hidden new gate.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>

#include "OpenRegNativeFunctions.h"

namespace openreg::native {
namespace {

// `gates + bias`, or a copy of `gates`: the inputs stay untouched, since
// autograd keeps them for double backward.
at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates.clone();
}

at::Tensor sum_over_batch(const at::Tensor& grad_gates, bool has_bias) {
  return has_bias ? grad_gates.sum(0, /*keepdim=*/false) : at::Tensor();
}

void check_cell_gates(const at::Tensor& input_gates, const at::Tensor& hidden_gates, int64_t gates, const char* op) {
  TORCH_CHECK(
      input_gates.dim() == 2 && input_gates.sizes() == hidden_gates.sizes() && input_gates.size(1) % gates == 0,
      op,
      ": expected input_gates and hidden_gates of one shape (batch, ",
      gates,
      " * hidden_size), got ",
      input_gates.sizes(),
      " and ",
      hidden_gates.sizes());
}

} // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell(
    const at::Tensor& input_gates,
    const at::Tensor& hidden_gates,
    const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias) {
  check_cell_gates(input_gates, hidden_gates, 4, "_thnn_fused_lstm_cell");
  // CPU: gates = linear_hh(hx).add_(linear_ih(input)), then in-place activations.
  at::Tensor gates = with_bias(hidden_gates, hidden_bias).add_(with_bias(input_gates, input_bias));
  auto chunked = gates.unsafe_chunk(4, 1);
  const at::Tensor& ingate = chunked[0].sigmoid_();
  const at::Tensor& forgetgate = chunked[1].sigmoid_();
  const at::Tensor& cellgate = chunked[2].tanh_();
  const at::Tensor& outgate = chunked[3].sigmoid_();
  at::Tensor cy = (forgetgate * cx).add_(ingate * cellgate);
  at::Tensor hy = outgate * cy.tanh();
  return {std::move(hy), std::move(cy), std::move(gates)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy,
    const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx,
    const at::Tensor& cy,
    const at::Tensor& workspace,
    bool has_bias) {
  const bool has_grad_hy = grad_hy.has_value() && grad_hy->defined();
  const bool has_grad_cy = grad_cy.has_value() && grad_cy->defined();
  if (!has_grad_hy && !has_grad_cy) {
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
  auto gates = workspace.unsafe_chunk(4, 1);
  const at::Tensor& i = gates[0];
  const at::Tensor& f = gates[1];
  const at::Tensor& g = gates[2];
  const at::Tensor& o = gates[3];
  const at::Tensor tanh_cy = cy.tanh();
  // hy = o * tanh(cy), cy = f * cx + i * g.
  at::Tensor grad_c = has_grad_cy ? grad_cy->clone() : at::zeros_like(cy);
  at::Tensor grad_o;
  if (has_grad_hy) {
    grad_c.add_(*grad_hy * o * (1 - tanh_cy * tanh_cy));
    grad_o = *grad_hy * tanh_cy * o * (1 - o);
  } else {
    grad_o = at::zeros_like(o);
  }
  at::Tensor grad_i = grad_c * g * i * (1 - i);
  at::Tensor grad_f = grad_c * cx * f * (1 - f);
  at::Tensor grad_g = grad_c * i * (1 - g * g);
  at::Tensor grad_gates = at::cat({grad_i, grad_f, grad_g, grad_o}, 1);
  at::Tensor grad_cx = grad_c * f;
  at::Tensor grad_bias = sum_over_batch(grad_gates, has_bias);
  return {std::move(grad_gates), std::move(grad_cx), std::move(grad_bias)};
}

std::tuple<at::Tensor, at::Tensor> thnn_fused_gru_cell(
    const at::Tensor& input_gates,
    const at::Tensor& hidden_gates,
    const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias) {
  check_cell_gates(input_gates, hidden_gates, 3, "_thnn_fused_gru_cell");
  const at::Tensor igates = with_bias(input_gates, input_bias);
  const at::Tensor hgates = with_bias(hidden_gates, hidden_bias);
  auto chunked_igates = igates.unsafe_chunk(3, 1);
  auto chunked_hgates = hgates.unsafe_chunk(3, 1);
  // CPU's order (RNN.cpp, GRUCell); the hidden new gate is multiplied out of
  // place because the backward needs it.
  at::Tensor reset_gate = chunked_hgates[0].add(chunked_igates[0]).sigmoid_();
  at::Tensor input_gate = chunked_hgates[1].add(chunked_igates[1]).sigmoid_();
  at::Tensor new_gate = chunked_igates[2].add(chunked_hgates[2] * reset_gate).tanh_();
  at::Tensor hy = (hx - new_gate).mul_(input_gate).add_(new_gate);
  at::Tensor workspace = at::cat({reset_gate, input_gate, new_gate, hx, chunked_hgates[2]}, 1);
  return {std::move(hy), std::move(workspace)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> thnn_fused_gru_cell_backward(
    const at::Tensor& grad_hy,
    const at::Tensor& workspace,
    bool has_bias) {
  TORCH_CHECK(
      workspace.dim() == 2 && workspace.size(1) % 5 == 0,
      "_thnn_fused_gru_cell_backward: expected a workspace of shape (batch, 5 * hidden_size), got ",
      workspace.sizes());
  auto saved = workspace.unsafe_chunk(5, 1);
  const at::Tensor& r = saved[0];
  const at::Tensor& z = saved[1];
  const at::Tensor& n = saved[2];
  const at::Tensor& hx = saved[3];
  const at::Tensor& hn = saved[4];
  // hy = (1 - z) * n + z * hx, n = tanh(in + r * hn), r and z sigmoids.
  at::Tensor grad_hx = grad_hy * z;
  at::Tensor grad_z = grad_hy * (hx - n) * z * (1 - z);
  at::Tensor grad_n = grad_hy * (1 - z) * (1 - n * n);
  at::Tensor grad_r = grad_n * hn * r * (1 - r);
  at::Tensor grad_input_gates = at::cat({grad_r, grad_z, grad_n}, 1);
  at::Tensor grad_hidden_gates = at::cat({grad_r, grad_z, grad_n * r}, 1);
  at::Tensor grad_input_bias = sum_over_batch(grad_input_gates, has_bias);
  at::Tensor grad_hidden_bias = sum_over_batch(grad_hidden_gates, has_bias);
  return {
      std::move(grad_input_gates),
      std::move(grad_hidden_gates),
      std::move(grad_hx),
      std::move(grad_input_bias),
      std::move(grad_hidden_bias)};
}

} // namespace openreg::native
