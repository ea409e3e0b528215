// nn.LSTM's and nn.GRU's operators (lstm.input, gru.input) for openreg
// tensors, and the fused LSTM and GRU cells that torch's RNN code calls for
// PrivateUse1 tensors (aten/src/ATen/native/RNN.cpp: LSTMCell and GRUCell take
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
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/native/RNN.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/lstm_native.h>
#include <ATen/ops/stack.h>
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

// The gates and next hidden state of one GRU step from its input and hidden
// gates (biases added), in the order of CPU's GRUCell. The reset and update
// gates are computed in place in `hgates`; the hidden new gate, hgates[2],
// stays as it is (the fused cell's backward needs it).
struct GruStep {
  at::Tensor reset_gate;
  at::Tensor input_gate;
  at::Tensor new_gate;
  at::Tensor hy;
};

GruStep gru_step(const std::vector<at::Tensor>& igates, const std::vector<at::Tensor>& hgates, const at::Tensor& hx) {
  GruStep step;
  step.reset_gate = hgates[0].add_(igates[0]).sigmoid_();
  step.input_gate = hgates[1].add_(igates[1]).sigmoid_();
  step.new_gate = igates[2].add(hgates[2] * step.reset_gate).tanh_();
  step.hy = (hx - step.new_gate).mul_(step.input_gate).add_(step.new_gate);
  return step;
}

// CPU's test for its oneDNN LSTM (use_mkldnn in aten/src/ATen/native/RNN.cpp),
// for openreg tensors. Half and bfloat16 are left to torch's composite: which
// of them CPU runs on oneDNN depends on the CPU (mkldnn_*_device_check).
bool cpu_would_use_onednn(const at::Tensor& input, at::TensorList hx) {
  return at::globalContext().userEnabledMkldnn() && input.scalar_type() == at::kFloat && input.numel() != 0 &&
      hx.size() == 2 && hx[0].sym_size(2) == hx[1].sym_size(2) && // no projections
      !hx[0].unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

} // namespace

// torch's lstm (CompositeImplicitAutograd) runs a PrivateUse1 LSTM step by
// step through the fused cell, with one input projection per step, where CPU
// runs the whole sequence on oneDNN (lstm_mkldnn_stub). This is the autograd
// kernel of lstm.input for openreg (`autograd: true` in the yaml): where CPU
// takes oneDNN, it runs CPU's driver of that path, whose operators
// (mkldnn_rnn_layer per layer and direction, cat, dropout, stack) reach openreg's
// kernels, mkldnn_rnn_layer and its backward being CPU's on the device memory;
// autograd records them as it does on CPU. Results and gradients are CPU's.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_input(
    const at::Tensor& input,
    at::TensorList hx,
    at::TensorList params,
    bool has_biases,
    int64_t num_layers,
    double dropout,
    bool train,
    bool bidirectional,
    bool batch_first) {
  if (cpu_would_use_onednn(input, hx)) {
    at::Tensor output, hy, cy;
    at::native::lstm_mkldnn_stub(
        c10::DeviceType::CPU, output, hy, cy, input, hx, params, has_biases, num_layers, dropout, train,
        bidirectional, batch_first);
    return {std::move(output), std::move(hy), std::move(cy)};
  }
  return at::native::lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
}

namespace {

// One GRU layer in one direction as CPU runs it (aten/src/ATen/native/RNN.cpp:
// FullLayer, FullBidirectionalLayer and GRUCell when `input.device().is_cpu()`):
// the input projected for every step at once, then per step the hidden
// projection and the gates, operator by operator in CPU's order.
std::pair<at::Tensor, at::Tensor> gru_direction(
    const at::Tensor& input,
    at::Tensor hidden,
    const at::Tensor& w_ih,
    const at::Tensor& w_hh,
    const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh,
    bool reverse) {
  const std::vector<at::Tensor> steps = at::linear(input, w_ih, b_ih).unbind(0);
  TORCH_CHECK(!steps.empty(), "Expected sequence length to be larger than 0 in RNN");
  std::vector<at::Tensor> outputs(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const size_t t = reverse ? steps.size() - 1 - i : i;
    hidden = gru_step(steps[t].unsafe_chunk(3, 1), at::linear(hidden, w_hh, b_hh).unsafe_chunk(3, 1), hidden).hy;
    outputs[t] = hidden;
  }
  return {at::stack(outputs, 0), hidden};
}

} // namespace

// torch's gru (CompositeImplicitAutograd) projects a CPU tensor's whole input
// once per layer and runs the rest of the cell as separate operators; a
// PrivateUse1 tensor it runs through the fused cell with one input projection
// per step. The simulated device runs CPU's kernels, so this autograd kernel
// of gru.input (`autograd: true`) takes CPU's route, with CPU's operators and
// so CPU's bits, and autograd records them as on CPU.
std::tuple<at::Tensor, at::Tensor> gru_input(
    const at::Tensor& input,
    const at::Tensor& hx,
    at::TensorList params,
    bool has_biases,
    int64_t num_layers,
    double dropout,
    bool train,
    bool bidirectional,
    bool batch_first) {
  const int64_t directions = bidirectional ? 2 : 1;
  const int64_t per_direction = has_biases ? 4 : 2;
  TORCH_CHECK(
      static_cast<int64_t>(params.size()) == num_layers * directions * per_direction,
      "gru: expected ", num_layers * directions * per_direction, " parameter tensors (",
      num_layers, " layers, ", directions, " directions, ", per_direction, " each), got ", params.size());
  TORCH_CHECK(
      hx.dim() == 3 && hx.size(0) == num_layers * directions,
      "gru: expected hx of shape (", num_layers * directions, ", batch, hidden_size), got ", hx.sizes());
  const std::vector<at::Tensor> hiddens = hx.unbind(0);
  std::vector<at::Tensor> final_hiddens;
  at::Tensor layer_input = batch_first ? input.transpose(0, 1) : input;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    std::vector<at::Tensor> outputs;
    for (int64_t direction = 0; direction < directions; ++direction) {
      const int64_t index = layer * directions + direction;
      const at::Tensor* w = &params[index * per_direction];
      const auto bias = [&](int64_t i) {
        return has_biases ? std::optional<at::Tensor>(w[i]) : std::nullopt;
      };
      auto [output, hidden] = gru_direction(layer_input, hiddens[index], w[0], w[1], bias(2), bias(3), direction == 1);
      outputs.push_back(std::move(output));
      final_hiddens.push_back(std::move(hidden));
    }
    layer_input = directions == 1 ? outputs[0] : at::cat(outputs, outputs[0].dim() - 1);
    if (dropout != 0 && train && layer < num_layers - 1) {
      layer_input = at::dropout(layer_input, dropout, /*train=*/true);
    }
  }
  if (batch_first) {
    layer_input = layer_input.transpose(0, 1);
  }
  return {std::move(layer_input), at::stack(final_hiddens, 0)};
}

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
  const auto hgates = with_bias(hidden_gates, hidden_bias).unsafe_chunk(3, 1);
  GruStep step = gru_step(with_bias(input_gates, input_bias).unsafe_chunk(3, 1), hgates, hx);
  at::Tensor workspace = at::cat({step.reset_gate, step.input_gate, step.new_gate, hx, hgates[2]}, 1);
  return {std::move(step.hy), std::move(workspace)};
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
