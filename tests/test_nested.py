"""Nested tensors of the strided layout on openreg: every operator on them runs
torch's NestedTensorCPU kernel on the device memory (the nested CPU fallback),
so results are CPU's, bit for bit, and stay nested openreg tensors; operators
torch has no nested kernel for raise a clear error."""

import gc
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

MODES = ("trace", "discrete")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"

# torch warns once that the strided layout's API is a prototype.
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")


def nested(*shapes, seed=0, **kwargs):
    g = torch.Generator().manual_seed(seed)
    return torch.nested.nested_tensor([torch.randn(*s, generator=g) for s in shapes], **kwargs)


def assert_equal(dev, cpu):
    """`dev` is on openreg and holds exactly `cpu`'s values (nested or dense)."""
    assert dev.device.type == "openreg", f"result on {dev.device}"
    assert dev.is_nested == cpu.is_nested
    if not cpu.is_nested:
        torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)
        return
    assert dev.dtype == cpu.dtype
    assert torch.equal(dev._nested_tensor_size(), cpu._nested_tensor_size())
    for d, c in zip(dev.unbind(), cpu.unbind(), strict=True):
        assert d.device.type == "openreg"
        torch.testing.assert_close(d.cpu(), c, rtol=0, atol=0)


def check(fn, *cpu_args):
    """fn on CPU tensors and on openreg copies of them gives the same result."""
    assert_equal(fn(*(a.to(DEV) for a in cpu_args)), fn(*cpu_args))


# -- construction and copies ---------------------------------------------------------


def test_nested_tensor_on_openreg_holds_the_given_tensors():
    tensors = [torch.randn(2, 3), torch.randn(4, 3)]
    for make in (torch.nested.nested_tensor, torch.nested.as_nested_tensor):
        nt = make(tensors, device=DEV)
        assert nt.is_nested and nt.device == torch.device("openreg:0")
        assert_equal(nt, torch.nested.nested_tensor(tensors))


def test_as_nested_tensor_of_an_openreg_tensor_views_it():
    base = torch.randn(3, 4, 5)
    nt = torch.nested.as_nested_tensor(base.to(DEV))
    assert_equal(nt, torch.nested.as_nested_tensor(base))


def test_to_openreg_and_back_to_cpu_round_trip():
    cpu = nested((2, 3), (4, 3))
    dev = cpu.to(DEV)
    assert dev.is_nested and dev.device.type == "openreg"
    back = dev.cpu()
    assert back.is_nested and back.device.type == "cpu"
    for b, c in zip(back.unbind(), cpu.unbind(), strict=True):
        assert torch.equal(b, c)
    assert_equal(cpu.to(DEV, torch.float64), cpu.to(torch.float64))
    assert_equal(dev.to(torch.float16), cpu.to(torch.float16))


def test_copy_between_cpu_and_openreg_nested_tensors():
    cpu = nested((2, 3), (4, 3))
    dev = torch.zeros_like(cpu.to(DEV))
    assert dev.device.type == "openreg"
    dev.copy_(cpu)
    assert_equal(dev, cpu)
    out = torch.zeros_like(cpu)
    out.copy_(dev)
    assert all(torch.equal(o, c) for o, c in zip(out.unbind(), cpu.unbind()))


def test_nested_tensor_from_a_padded_tensor_and_a_mask():
    t, mask = torch.randn(2, 5, 8), torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    assert_equal(torch._nested_tensor_from_mask(t.to(DEV), mask.to(DEV)), torch._nested_tensor_from_mask(t, mask))
    example = nested((5, 8), (3, 8))
    assert_equal(
        torch._nested_from_padded(t.to(DEV), example._nested_tensor_size()),
        torch._nested_from_padded(t, example._nested_tensor_size()),
    )


# -- operators -----------------------------------------------------------------------


def test_to_padded_tensor():
    cpu = nested((2, 3), (4, 3))
    check(lambda x: torch.nested.to_padded_tensor(x, 0.0), cpu)
    check(lambda x: torch.nested.to_padded_tensor(x, -1.0, (2, 5, 4)), cpu)


def test_unbind_returns_views_of_the_device_memory():
    dev = nested((2, 3), (4, 3)).to(DEV)
    first, second = dev.unbind()
    assert first.device.type == "openreg" and first.shape == (2, 3) and second.shape == (4, 3)
    first.fill_(7.0)
    assert (dev.unbind()[0].cpu() == 7.0).all()


@pytest.mark.parametrize("view", ["transpose", "view", "unbind"])
def test_views_under_inference_mode_of_a_tensor_made_outside_it(view):
    make = {
        "transpose": lambda x: x.transpose(-1, -2),
        "view": lambda x: x.view(2, -1, 2, 2),
        "unbind": lambda x: x.unbind()[1],
    }[view]
    cpu = nested((2, 4), (3, 4))
    dev = cpu.to(DEV)
    with torch.inference_mode():
        expected, got = make(cpu), make(dev)
    assert got.is_inference() == expected.is_inference()
    assert_equal(got, expected)


def test_elementwise_operators():
    a, b = nested((2, 3), (4, 3)), nested((2, 3), (4, 3), seed=1)
    check(torch.add, a, b)
    check(lambda x, y: x * y - 2.5 * x, a, b)
    check(torch.relu, a)
    check(F.gelu, a)
    check(torch.tanh, a)
    check(lambda x: x.abs().sqrt(), a)
    check(lambda x: x.to(torch.float64) + 1, a)


def test_in_place_operators_write_the_device_memory():
    cpu = nested((2, 3), (4, 3))
    dev = cpu.to(DEV)
    ret = dev.mul_(3.0)
    assert ret is dev
    cpu.mul_(3.0)
    dev.add_(dev)
    cpu.add_(cpu)
    assert_equal(dev, cpu)


def test_linear_matmul_and_bmm():
    x = nested((2, 4), (5, 4))
    w, bias = torch.randn(6, 4), torch.randn(6)
    check(F.linear, x, w, bias)
    check(F.linear, x, w)
    check(lambda a, b: torch.matmul(a, b.transpose(-1, -2)), x, x)
    check(torch.bmm, nested((3, 4), (5, 4)), nested((4, 2), (4, 6), seed=1))


def test_softmax_and_layer_norm():
    x = nested((2, 5), (4, 5))
    check(lambda t: torch.softmax(t, -1), x)
    check(lambda t: F.layer_norm(t, (5,), torch.randn(5, generator=torch.Generator().manual_seed(2)).to(t.device),
                                 torch.randn(5, generator=torch.Generator().manual_seed(3)).to(t.device)), x)
    norm = torch.nn.LayerNorm(5)
    assert_equal(norm.to(DEV)(x.to(DEV)), norm.cpu()(x))


def test_autograd_through_nested_operators():
    leaves = [torch.randn(2, 3), torch.randn(4, 3)]
    cpu = torch.nested.nested_tensor(leaves, requires_grad=True)
    dev = torch.nested.nested_tensor(leaves, device=DEV, requires_grad=True)
    for x in (cpu, dev):
        torch.nested.to_padded_tensor((x * 2).relu(), 0.0).sum().backward()
    assert_equal(dev.grad, cpu.grad)


def test_transformer_encoder_fast_path_matches_cpu_bit_for_bit():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        ref = model(x, src_key_padding_mask=mask)
        model.to(DEV)
        torch.openreg.reset_fallback_stats()
        out = model(x.to(DEV), src_key_padding_mask=mask.to(DEV))
    ran = torch.openreg.fallback_stats()
    # The fast path ran: a nested tensor from the mask, the fused layer on it.
    assert {"aten::_nested_tensor_from_mask", "aten::_transformer_encoder_layer_fwd", "aten::to_padded_tensor"} <= set(ran)
    assert out.device.type == "openreg"
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)


# -- errors, routes, memory ---------------------------------------------------------


def test_an_operator_without_a_nested_kernel_raises_a_clear_error():
    dev = nested((2, 3), (4, 3)).to(DEV)
    with pytest.raises(NotImplementedError, match=r"aten::cumsum got a nested tensor of the strided layout on "
                       r"openreg.*no NestedTensorCPU kernel.*layout=torch\.jagged"):
        torch.cumsum(dev, 1)
    # CPU has no kernel either: openreg never answers where CPU cannot.
    with pytest.raises((NotImplementedError, RuntimeError)):
        torch.cumsum(nested((2, 3), (4, 3)), 1)


def test_fallback_mode_error_forbids_the_nested_fallback():
    dev = nested((2, 3), (4, 3)).to(DEV)
    torch.openreg.set_fallback_mode("error")
    try:
        with pytest.raises(NotImplementedError, match=r"aten::relu.*nested CPU fallback.*OPENREG_FALLBACK=error"):
            torch.relu(dev)
    finally:
        torch.openreg.set_fallback_mode("silent")


def test_operators_on_nested_tensors_are_counted_and_traced_as_the_nested_fallback():
    code = (
        "import torch, warnings; warnings.simplefilter('ignore')\n"
        "x = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], device='openreg')\n"
        "torch.nested.to_padded_tensor(torch.relu(x), 0.0)\n"
    )
    env = dict(os.environ, TORCH_SHOW_DISPATCH_TRACE="1")
    err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stderr
    assert "[call] op=[aten::relu], key=[NestedTensorPrivateUse1] -> nested_fallback" in err
    assert "[call] op=[aten::to_padded_tensor], key=[NestedTensorPrivateUse1] -> nested_fallback" in err


def test_info_reports_how_nested_operators_are_served():
    from torch_openreg import info

    assert info.nested_route("aten::add.Tensor") == "nested_fallback"
    assert info.nested_route("aten::linear") == "nested_fallback"  # registered by name over the composite
    assert info.nested_route("aten::softmax.int") == "composite"
    assert info.nested_route("aten::cumsum") == "unsupported"
    assert info.classify("aten::linear").nested == "nested_fallback"


def test_memory_goes_back_after_the_nested_tensors_are_dropped():
    gc.collect()
    base = torch.openreg.memory_allocated()
    cpu = nested((64, 32), (17, 32))
    dev = cpu.to(DEV)
    results = [dev * 2, F.linear(dev, torch.randn(8, 32, device=DEV)), torch.softmax(dev, -1),
               torch.nested.to_padded_tensor(dev, 0.0), dev.unbind(), dev.cpu()]
    assert torch.openreg.memory_allocated() > base
    del dev, results
    gc.collect()
    assert torch.openreg.memory_allocated() == base

