"""scaled_dot_product_attention on openreg: the fused route torch keeps for
PrivateUse1 backends (`_fused_sdp_choice_stub` -> `SDPBackend.overrideable` ->
`_scaled_dot_product_fused_attention_overrideable` and its backward), served by
CPU's flash-attention kernel on the device memory wherever CPU picks it, so
results and gradients have CPU's bits; everything else takes torch's math path
on the device, as on CPU."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"
FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"
FUSED_BACKWARD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"
MATH = "aten::_scaled_dot_product_attention_math"


def qkv(batch=2, heads=4, kv_heads=None, q_len=16, kv_len=None, dim=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv_heads = kv_heads or heads
    kv_len = kv_len or q_len
    q = torch.randn(batch, heads, q_len, dim, generator=g, dtype=dtype)
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=g, dtype=dtype)
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=g, dtype=dtype)
    return q, k, v


def ops_run(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def run_both(q, k, v, backward=False, **kwargs):
    """SDPA on CPU and on openreg from the same values: (cpu, openreg)
    outputs, and input gradients when `backward`."""
    results = []
    for device in ("cpu", DEV):
        args = [t.to(device).requires_grad_(backward) for t in (q, k, v)]
        if isinstance(kwargs.get("attn_mask"), torch.Tensor):
            kwargs = dict(kwargs, attn_mask=kwargs["attn_mask"].to(device))
        out = F.scaled_dot_product_attention(*args, **kwargs)
        grads = ()
        if backward:
            grad_out = torch.ones_like(out).mul_(0.5) + torch.arange(out.shape[-1], device=device) / out.shape[-1]
            grads = torch.autograd.grad(out, args, grad_out)
        results.append((out.cpu(), *(g.cpu() for g in grads)))
    return results


def assert_bits_equal(cpu, dev):
    for a, b in zip(cpu, dev, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.3),
    "float_mask": dict(attn_mask="float"),
    "bool_mask": dict(attn_mask="bool"),
    "broadcast_mask": dict(attn_mask="broadcast"),
}


def make_mask(kind, q, k):
    g = torch.Generator().manual_seed(1)
    shape = (q.shape[0], 1, q.shape[2], k.shape[2]) if kind == "broadcast" else (q.shape[2], k.shape[2])
    if kind == "bool":
        mask = torch.rand(shape, generator=g) > 0.3
        mask[..., 0] = True  # no fully masked row
        return mask
    return torch.randn(shape, generator=g)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fused_route_gives_cpus_bits_forward_and_backward(case, dtype):
    q, k, v = qkv(dtype=dtype)
    kwargs = dict(CASES[case])
    if "attn_mask" in kwargs:
        kwargs["attn_mask"] = make_mask(kwargs["attn_mask"], q, k).to(dtype if kwargs["attn_mask"] != "bool" else torch.bool)
    assert torch._fused_sdp_choice(q, k, v, **{k_: v_ for k_, v_ in kwargs.items()}) == SDPBackend.FLASH_ATTENTION.value
    cpu, dev = run_both(q, k, v, backward=True, **kwargs)
    assert_bits_equal(cpu, dev)


def test_grouped_query_attention_gives_cpus_bits():
    q, k, v = qkv(heads=8, kv_heads=2)
    cpu, dev = run_both(q, k, v, backward=True, enable_gqa=True, is_causal=True)
    assert_bits_equal(cpu, dev)


def test_cross_attention_of_other_lengths_gives_cpus_bits():
    q, k, v = qkv(q_len=5, kv_len=19, dim=24)
    cpu, dev = run_both(q, k, v, backward=True)
    assert_bits_equal(cpu, dev)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_forward_and_backward_give_cpus_results(backend):
    # A compiled graph saves the forward's outputs for the backward and checks the
    # layouts the fake kernels predicted: CPU's flash attention lays out its
    # logsumexp and gradients its own way (torch_openreg/openreg/_fake_tensor.py).
    q, k, v = qkv(batch=2, heads=3, q_len=5, dim=8)
    torch._dynamo.reset()
    compiled = torch.compile(F.scaled_dot_product_attention, backend=backend)
    results = []
    for device, attention in (("cpu", F.scaled_dot_product_attention), (DEV, compiled)):
        args = [t.to(device).requires_grad_() for t in (q, k, v)]
        out = attention(*args, is_causal=True)
        results.append([out.cpu(), *(g.cpu() for g in torch.autograd.grad(out.sum(), args))])
    torch.testing.assert_close(results[1], results[0])


def test_openreg_asks_its_own_choice_and_runs_the_overrideable_route():
    q, k, v = (t.to(DEV) for t in qkv())
    assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
    q.requires_grad_(True)
    names = ops_run(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    assert FUSED in names and FUSED_BACKWARD in names
    assert MATH not in names
    assert torch.openreg.fallback_stats().get(FUSED) is None


def test_sdpa_kernel_selects_math_or_fused_as_on_cpu():
    q, k, v = (t.to(DEV) for t in qkv())
    with sdpa_kernel(SDPBackend.MATH):
        names = ops_run(lambda: F.scaled_dot_product_attention(q, k, v))
    assert MATH in names and FUSED not in names
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        names = ops_run(lambda: F.scaled_dot_product_attention(q, k, v))
    assert FUSED in names and MATH not in names
    # Neither math nor flash: no kernel, as on CPU.
    for device in ("cpu", DEV):
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(*(t.to(device) for t in (q, k, v)))


def test_what_cpu_runs_on_its_math_path_takes_the_math_path_here_too():
    q, k, v = qkv()
    mask = torch.randn(16, 16, requires_grad=True)
    # A mask that needs a gradient: the fused kernel has none for it.
    for device in ("cpu", DEV):
        args = [t.to(device) for t in (q, k, v)]
        m = mask.detach().to(device).requires_grad_(True)
        assert torch._fused_sdp_choice(*args, attn_mask=m) == SDPBackend.MATH.value
        names = ops_run(lambda: F.scaled_dot_product_attention(*args, attn_mask=m).sum().backward())
        assert MATH in names
        assert m.grad is not None


def test_dropout_draws_from_the_devices_generator_like_cpu():
    q, k, v = qkv()
    outs = []
    for device, seed in (("cpu", torch.manual_seed), (DEV, torch.openreg.manual_seed)):
        seed(7)
        outs.append(F.scaled_dot_product_attention(*(t.to(device) for t in (q, k, v)), dropout_p=0.3).cpu())
    torch.testing.assert_close(outs[1], outs[0])
    # The device's generator, not CPU's: reseeding CPU's alone changes nothing here.
    torch.openreg.manual_seed(7)
    torch.default_generator.manual_seed(123)
    again = F.scaled_dot_product_attention(*(t.to(DEV) for t in (q, k, v)), dropout_p=0.3).cpu()
    torch.testing.assert_close(again, outs[1])


def test_inputs_on_two_devices_raise_the_device_error():
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="openreg:0.*cpu|cpu.*openreg:0"):
        F.scaled_dot_product_attention(q.to(DEV), k, v.to(DEV))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_overrideable_backward_computes_the_gradient_of_an_additive_mask(is_causal, dtype):
    """A direct call may ask for attn_bias's gradient (grad_input_mask[3]); the
    reference is autograd through softmax(q k^T * scale + mask) v on CPU."""
    q, k, v = qkv(q_len=6, dim=8)
    mask = make_mask("broadcast", q, k)  # broadcast over the heads
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v, mask)]
    scores = leaves[0] @ leaves[1].transpose(-2, -1) / 8**0.5 + leaves[3]
    if is_causal:
        scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).tril().logical_not(), float("-inf"))
    expected = torch.autograd.grad(scores.softmax(-1) @ leaves[2], leaves, grad_out)

    q, k, v, mask, grad_out = (t.to(DEV, dtype) for t in (q, k, v, mask, grad_out))
    out, lse, *_, seed, offset, _ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        q, k, v, mask, is_causal=is_causal)
    grads = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
        grad_out, q, k, v, mask, [True, True, True, True], out, lse, None, None, 6, 6, 0.0, is_causal, seed, offset)
    tolerance = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for got, want in zip(grads, expected, strict=True):
        assert got.dtype == dtype and got.shape == want.shape
        torch.testing.assert_close(got.cpu().float(), want, **tolerance)


def test_overrideable_backward_refuses_a_mask_gradient_without_a_float_mask():
    q, k, v = (t.to(DEV) for t in qkv())
    out, lse, *rest = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v)
    with pytest.raises(RuntimeError, match=r"gradient of attn_bias, which needs a floating point attn_bias \(got none\)"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
            out, q, k, v, None, [True, True, True, True], out, lse, None, None, 16, 16, 0.0, False, None, None
        )
