"""Recurrent modules on openreg. torch's RNN code takes the fused cells
(`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell`) for PrivateUse1 tensors, as
for CUDA; openreg serves them and their backward functions
(csrc/kernels/RNN.cpp), so nn.LSTM, nn.GRU and their cells train as on
CPU. nn.LSTM and nn.GRU themselves take CPU's route (RNN.cpp's lstm_input and
gru_input): oneDNN's LSTM layer where CPU uses it, the GRU's input projected
once per layer, so their results and gradients have CPU's bits."""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.profiler import ProfilerActivity, profile

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"

MODULES = {
    "lstm": lambda: nn.LSTM(6, 8, num_layers=2),
    "lstm_batch_first_bidirectional": lambda: nn.LSTM(6, 8, batch_first=True, bidirectional=True),
    "lstm_proj": lambda: nn.LSTM(6, 8, proj_size=4),
    "lstm_no_bias": lambda: nn.LSTM(6, 8, bias=False),
    "gru": lambda: nn.GRU(6, 8, num_layers=2),
    "gru_bidirectional": lambda: nn.GRU(6, 8, bidirectional=True),
    "gru_no_bias": lambda: nn.GRU(6, 8, bias=False),
}


def pair(factory):
    torch.manual_seed(0)
    cpu = factory()
    dev = factory()
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to(DEV)


def run(module, x, device):
    out = module(x.to(device))
    out = out[0] if isinstance(out, tuple) else out
    loss = (out * torch.linspace(-1, 1, out.shape[-1], device=device)).sum()
    grads = torch.autograd.grad(loss, list(module.parameters()))
    return out.detach().cpu(), [g.cpu() for g in grads]


# The fused cells compute the gates as matmul + bias where CPU's cell uses
# addmm, whose rounding may differ in the last bit; the backward is one
# formula instead of autograd's chain. Elementwise, everything else is CPU's.
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_recurrent_module_matches_cpu_forward_and_backward(name):
    cpu, dev = pair(MODULES[name])
    x = torch.randn(5, 3, 6)
    out_cpu, grads_cpu = run(cpu, x, "cpu")
    torch.openreg.reset_fallback_stats()
    out_dev, grads_dev = run(dev, x, DEV)
    assert torch.openreg.fallback_stats() == {}
    torch.testing.assert_close(out_dev, out_cpu, **TOL)
    for g_dev, g_cpu in zip(grads_dev, grads_cpu, strict=True):
        torch.testing.assert_close(g_dev, g_cpu, **TOL)


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell"])
def test_cells_run_the_fused_kernels(cell):
    cpu, dev = pair(lambda: getattr(nn, cell)(6, 8))
    x = torch.randn(3, 6)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out_dev, grads_dev = run(dev, x, DEV)
    names = {e.key for e in prof.key_averages()}
    kind = "lstm" if cell == "LSTMCell" else "gru"
    assert f"aten::_thnn_fused_{kind}_cell" in names
    assert (f"aten::_thnn_fused_lstm_cell_backward_impl" if kind == "lstm" else "aten::_thnn_fused_gru_cell_backward") in names
    out_cpu, grads_cpu = run(cpu, x, "cpu")
    torch.testing.assert_close(out_dev, out_cpu, **TOL)
    for g_dev, g_cpu in zip(grads_dev, grads_cpu, strict=True):
        torch.testing.assert_close(g_dev, g_cpu, **TOL)


def test_packed_sequences_and_initial_state():
    cpu, dev = pair(lambda: nn.LSTM(4, 5, batch_first=True))
    x = torch.randn(3, 7, 4)
    lengths = torch.tensor([7, 4, 2])
    h0 = (torch.randn(1, 3, 5), torch.randn(1, 3, 5))
    outs = []
    for module, device in ((cpu, "cpu"), (dev, DEV)):
        packed = pack_padded_sequence(x.to(device), lengths, batch_first=True)
        out, (h, c) = module(packed, tuple(t.to(device) for t in h0))
        out, _ = pad_packed_sequence(out, batch_first=True)
        outs.append([t.detach().cpu() for t in (out, h, c)])
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(b, a, **TOL)


def test_double_backward_through_a_cell():
    cpu, dev = pair(lambda: nn.GRUCell(3, 4))
    results = []
    for module, device in ((cpu, "cpu"), (dev, DEV)):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_(True)
        (gx,) = torch.autograd.grad(module(x).pow(2).sum(), x, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.sum(), x)
        results.append(ggx.cpu())
    torch.testing.assert_close(results[1], results[0], **TOL)


def test_fused_cells_refuse_gates_of_mismatched_shapes():
    a = torch.zeros(2, 8, device=DEV)
    with pytest.raises(RuntimeError, match="one shape"):
        torch.ops.aten._thnn_fused_lstm_cell(a, torch.zeros(2, 12, device=DEV), torch.zeros(2, 2, device=DEV))
    with pytest.raises(RuntimeError, match="one shape"):
        torch.ops.aten._thnn_fused_gru_cell(torch.zeros(2, 6, device=DEV), torch.zeros(3, 6, device=DEV), torch.zeros(2, 2, device=DEV))


def ops_of_bitwise_equal_run(cpu, dev, x):
    """Runs forward and backward on both modules, requires CPU's bits on
    openreg, and returns the operators openreg's run called."""
    out_cpu, grads_cpu = run(cpu, x, "cpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out_dev, grads_dev = run(dev, x, DEV)
    torch.testing.assert_close(out_dev, out_cpu, rtol=0, atol=0)
    for g_dev, g_cpu in zip(grads_dev, grads_cpu, strict=True):
        torch.testing.assert_close(g_dev, g_cpu, rtol=0, atol=0)
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize(
    "factory",
    [
        lambda: nn.LSTM(6, 8, num_layers=2),
        lambda: nn.LSTM(6, 8, batch_first=True, bidirectional=True),
        lambda: nn.LSTM(6, 8, bias=False),
    ],
    ids=["two_layers", "batch_first_bidirectional", "no_bias"],
)
def test_lstm_takes_cpus_onednn_route_with_cpus_bits(factory):
    cpu, dev = pair(factory)
    names = ops_of_bitwise_equal_run(cpu, dev, torch.randn(5, 3, 6))
    assert "aten::mkldnn_rnn_layer" in names and "aten::mkldnn_rnn_layer_backward" in names
    assert "aten::_thnn_fused_lstm_cell" not in names


def test_lstm_dropout_between_layers_draws_from_the_devices_generator_like_cpu():
    cpu, dev = pair(lambda: nn.LSTM(6, 8, num_layers=3, dropout=0.4))
    x = torch.randn(5, 3, 6)
    torch.manual_seed(3)
    out_cpu = cpu(x)[0]
    torch.openreg.manual_seed(3)
    out_dev = dev(x.to(DEV))[0]
    torch.testing.assert_close(out_dev.cpu(), out_cpu, rtol=0, atol=0)


def test_lstm_outside_cpus_onednn_route_takes_the_fused_cells():
    # Projections (CPU has no oneDNN route for them) and float64.
    for factory, dtype in ((lambda: nn.LSTM(6, 8, proj_size=4), torch.float32), (lambda: nn.LSTM(6, 8), torch.float64)):
        cpu, dev = pair(factory)
        cpu.to(dtype), dev.to(dtype)
        x = torch.randn(5, 3, 6, dtype=dtype)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out_dev = dev(x.to(DEV))[0]
        names = {e.key for e in prof.key_averages()}
        assert "aten::_thnn_fused_lstm_cell" in names and "aten::mkldnn_rnn_layer" not in names
        torch.testing.assert_close(out_dev.detach().cpu(), cpu(x)[0].detach(), **TOL)


@pytest.mark.parametrize(
    "factory",
    [
        lambda: nn.GRU(6, 8, num_layers=2),
        lambda: nn.GRU(6, 8, batch_first=True, bidirectional=True, num_layers=2),
        lambda: nn.GRU(6, 8, bias=False),
        lambda: nn.GRU(6, 8).double(),
    ],
    ids=["two_layers", "batch_first_bidirectional", "no_bias", "float64"],
)
def test_gru_takes_cpus_route_with_cpus_bits(factory):
    cpu, dev = pair(factory)
    names = ops_of_bitwise_equal_run(cpu, dev, torch.randn(5, 3, 6, dtype=next(cpu.parameters()).dtype))
    assert "aten::_thnn_fused_gru_cell" not in names


def test_gru_with_initial_state_dropout_and_bad_shapes():
    cpu, dev = pair(lambda: nn.GRU(4, 5, num_layers=2, dropout=0.5))
    x, h0 = torch.randn(6, 2, 4), torch.randn(2, 2, 5)
    torch.manual_seed(5)
    out_cpu, h_cpu = cpu(x, h0)
    torch.openreg.manual_seed(5)
    out_dev, h_dev = dev(x.to(DEV), h0.to(DEV))
    torch.testing.assert_close(out_dev.cpu(), out_cpu, rtol=0, atol=0)
    torch.testing.assert_close(h_dev.cpu(), h_cpu, rtol=0, atol=0)
    # torch's own argument checks run first, as on CPU.
    for device, module in (("cpu", cpu), (DEV, dev)):
        with pytest.raises(RuntimeError, match="Expected hidden size"):
            module(x.to(device), torch.randn(1, 2, 5, device=device))
    # An empty sequence: the same error as CPU's.
    with pytest.raises(RuntimeError, match="larger than 0"):
        torch.gru(torch.zeros(0, 2, 4, device=DEV), h0.to(DEV), list(dev._flat_weights), True, 2, 0.0, False, False, False)

