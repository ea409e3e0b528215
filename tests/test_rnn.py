"""Recurrent modules on openreg. torch's RNN code takes the fused cells
(`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell`) for PrivateUse1 tensors, as
for CUDA; openreg serves them and their backward functions
(csrc/aten/native/RNN.cpp), so nn.LSTM, nn.GRU and their cells train as on
CPU."""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.profiler import ProfilerActivity, profile

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
