"""Moving modules and parameters to openreg keeps them what they were, as on
CUDA: `Module.to`/`_apply` swaps each Parameter's data in place (the
`_has_compatible_shallow_copy_type` kernel, csrc/kernels/View.cpp), so
tied weights stay tied, lazy modules keep their UninitializedParameter,
optimizers built before the move keep training the module's parameters."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight


def test_openreg_and_cpu_dense_tensors_may_exchange_metadata():
    cpu, dev = torch.zeros(2), torch.zeros(2, device=DEV)
    assert torch._has_compatible_shallow_copy_type(cpu, dev)
    assert torch._has_compatible_shallow_copy_type(dev, cpu)
    assert torch._has_compatible_shallow_copy_type(dev, torch.zeros(3, device=DEV))
    # Elsewhere openreg answers as CPU does (meta, sparse: no).
    for other in (torch.zeros(2, device="meta"), torch.zeros(2, 2).to_sparse()):
        assert torch._has_compatible_shallow_copy_type(dev, other) == torch._has_compatible_shallow_copy_type(cpu, other)
        assert not torch._has_compatible_shallow_copy_type(dev, other)


@pytest.mark.parametrize("move", ["to", "openreg", "to_device_object"])
def test_to_keeps_parameter_objects_and_ties(move):
    m = Tied()
    params = {name: p for name, p in m.named_parameters()}
    moved = {"to": lambda: m.to(DEV), "openreg": m.openreg, "to_device_object": lambda: m.to(torch.device(DEV, 0))}[move]()
    assert moved is m
    assert m.a.weight is m.b.weight
    assert {name: p for name, p in m.named_parameters()} == params
    assert all(p.device.type == DEV for p in m.parameters())
    assert sum(p.numel() for p in m.parameters()) == 4 * 4 + 4 + 4


def test_gpt2_like_tied_embedding_stays_tied_through_a_training_step():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(50, 8)
            self.head = nn.Linear(8, 50, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, x):
            return self.head(self.wte(x))

    torch.manual_seed(0)
    cpu = LM()
    dev = LM()
    dev.load_state_dict(cpu.state_dict())
    dev.to(DEV)
    assert dev.head.weight is dev.wte.weight
    x = torch.randint(0, 50, (2, 6))
    for model, device in ((cpu, "cpu"), (dev, DEV)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(x.to(device)).logsumexp(-1).mean()
        loss.backward()
        opt.step()
    torch.testing.assert_close(dev.wte.weight.cpu(), cpu.wte.weight)
    assert dev.head.weight is dev.wte.weight


def test_optimizer_built_before_the_move_trains_the_moved_module():
    m = nn.Linear(3, 2)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m.to(DEV)
    before = m.weight.detach().cpu().clone()
    m(torch.randn(4, 3, device=DEV)).sum().backward()
    opt.step()
    assert opt.param_groups[0]["params"][0] is m.weight
    assert not torch.equal(m.weight.detach().cpu(), before)
    assert opt.state[m.weight]["exp_avg"].device.type == DEV


def test_gradients_move_with_their_parameters():
    m = nn.Linear(3, 2)
    m(torch.randn(4, 3)).sum().backward()
    grad = m.weight.grad.clone()
    m.to(DEV)
    assert m.weight.grad.device.type == DEV
    torch.testing.assert_close(m.weight.grad.cpu(), grad)


def test_setting_data_moves_a_parameter_in_place():
    p = nn.Parameter(torch.randn(3))
    values = p.detach().clone()
    p.data = p.data.to(DEV)
    assert p.device.type == DEV and isinstance(p, nn.Parameter) and p.requires_grad
    torch.testing.assert_close(p.detach().cpu(), values)
    p.data = torch.zeros(5)
    assert p.device.type == "cpu" and p.shape == (5,)


def test_load_state_dict_with_assign_takes_the_openreg_tensors():
    src = nn.Linear(3, 2).to(DEV)
    with torch.device("meta"):
        dst = nn.Linear(3, 2)
    dst.load_state_dict(src.state_dict(), assign=True)
    assert dst.weight.device.type == DEV and isinstance(dst.weight, nn.Parameter)
    torch.testing.assert_close(dst.weight.detach().cpu(), src.weight.detach().cpu())
    # Into an openreg module without assign: copied in place.
    target = nn.Linear(3, 2).to(DEV)
    weight = target.weight
    target.load_state_dict(nn.Linear(3, 2).state_dict())
    assert target.weight is weight and weight.device.type == DEV


def test_lazy_modules_initialise_on_the_device():
    for lazy, x in (
        (nn.LazyLinear(3), torch.randn(2, 4)),
        (nn.LazyConv2d(2, 3), torch.randn(1, 3, 6, 6)),
        (nn.LazyBatchNorm1d(), torch.randn(4, 5)),
    ):
        m = lazy.to(DEV)
        out = m(x.to(DEV))
        assert out.device.type == DEV
        assert all(p.device.type == DEV and not isinstance(p, nn.parameter.UninitializedParameter) for p in m.parameters())


def test_parametrizations_and_weight_norm_survive_the_move():
    m = nn.utils.parametrizations.orthogonal(nn.Linear(4, 4))
    original = m.parametrizations.weight.original
    m.to(DEV)
    assert m.parametrizations.weight.original is original and original.device.type == DEV
    w = m.weight
    torch.testing.assert_close((w @ w.T).cpu(), torch.eye(4), atol=1e-5, rtol=0)

    wn = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))
    g, v = wn.parametrizations.weight.original0, wn.parametrizations.weight.original1
    expected = wn(torch.ones(2, 4))
    wn.to(DEV)
    assert wn.parametrizations.weight.original0 is g and wn.parametrizations.weight.original1 is v
    torch.testing.assert_close(wn(torch.ones(2, 4, device=DEV)).cpu(), expected)


def test_module_with_parameters_on_two_devices_raises_the_device_error():
    m = nn.Sequential(nn.Linear(4, 4).to(DEV), nn.Linear(4, 4))
    with pytest.raises(RuntimeError, match=r"openreg:0 and cpu|cpu and openreg:0"):
        m(torch.randn(2, 4, device=DEV))
    with pytest.raises(RuntimeError, match=r"openreg:0 and cpu|cpu and openreg:0"):
        nn.Linear(4, 4).to(DEV)(torch.randn(2, 4))


def test_to_that_runs_out_of_device_memory_raises_and_gives_the_memory_back():
    script = textwrap.dedent(
        """
        import gc, torch
        from torch import nn
        base = torch.openreg.memory_allocated()
        m = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(8)])  # 8 x 16 MiB
        try:
            m.to("openreg")
        except torch.OutOfMemoryError as e:
            print("OOM", "openreg" in str(e))
        moved = sum(p.device.type == "openreg" for p in m.parameters())
        print("moved", 0 < moved < 8)
        del m
        gc.collect()
        print("back", torch.openreg.memory_allocated() == base)
        torch.openreg.empty_cache()
        x = torch.ones(1024, 1024, device="openreg")
        print("usable", x.sum().item() == 1024 * 1024)
        """
    )
    env = dict(os.environ, OPENREG_DEVICE_MEMORY="100M")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["OOM", "True", "moved", "True", "back", "True", "usable", "True"], out.stdout
