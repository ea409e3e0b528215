"""Structured operators with an openreg impl() (`structured: impl:` in
backend_functions.yaml): cat, mm, addmm, bmm and baddbmm. torch's meta() checks and sizes;
openreg's impl works on kernel addresses, and for mm/addmm hands what it cannot
do to CPU's kernel. Both routes must give CPU's results bit for bit."""

import pytest
import torch
from torch.testing import assert_close

DEV = "openreg"


def on(t):
    return t.to(DEV)


def same_as_cpu(fn, *args):
    expected = fn(*args)
    actual = fn(*(on(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert actual.device.type == DEV
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.stride() == expected.stride()
    assert torch.equal(actual.cpu(), expected), (actual.cpu(), expected)


# --- mm / addmm -----------------------------------------------------------------


def layouts(m, k, n, dtype):
    """Operand pairs in every layout BLAS reads in place, and some it cannot."""
    g = torch.Generator().manual_seed(m * 100 + k * 10 + n)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    yield "contiguous", a, b
    yield "transposed", a.t().contiguous().t(), b.t().contiguous().t()
    yield "mixed", a, b.t().contiguous().t()
    yield "padded rows", torch.randn(m, k + 3, generator=g).to(dtype)[:, :k], b
    yield "strided (copied)", torch.randn(m, 2 * k, generator=g).to(dtype)[:, ::2], b


SHAPES = [(4, 4, 4), (1, 5, 3), (3, 5, 1), (4, 1, 6), (1, 1, 1), (33, 17, 65)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_mm_is_cpus_bit_for_bit(shape, dtype):
    for name, a, b in layouts(*shape, dtype):
        same_as_cpu(torch.mm, a, b)
        same_as_cpu(torch.matmul, a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_addmm_is_cpus_bit_for_bit(shape, dtype):
    m, k, n = shape
    for name, a, b in layouts(*shape, dtype):
        for bias in (torch.randn(n).to(dtype), torch.randn(m, n).to(dtype), torch.randn(1, 1).to(dtype)):
            same_as_cpu(torch.addmm, bias, a, b)
            same_as_cpu(lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=-2.0), bias, a, b)


def test_linear_is_cpus_bit_for_bit():
    x, w, bias = torch.randn(8, 16), torch.randn(32, 16), torch.randn(32)
    same_as_cpu(torch.nn.functional.linear, x, w, bias)
    same_as_cpu(torch.nn.functional.linear, x, w)


def test_addmm_with_beta_zero_ignores_nan_in_the_bias():
    bias = torch.full((3, 3), float("nan"))
    a, b = torch.randn(3, 2), torch.randn(2, 3)
    same_as_cpu(lambda c, x, y: torch.addmm(c, x, y, beta=0), bias, a, b)


def test_mm_into_transposed_and_strided_out():
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    for make in (lambda d: torch.empty(4, 5, device=d).t(), lambda d: torch.empty(5, 8, device=d)[:, ::2]):
        expected = make("cpu")
        torch.mm(a, b, out=expected)
        out = make(DEV)
        r = torch.mm(on(a), on(b), out=out)
        assert r is out
        assert torch.equal(out.cpu(), expected)


def test_addmm_in_place_and_out_of_another_shape():
    c, a, b = torch.randn(4, 4), torch.randn(4, 2), torch.randn(2, 4)
    expected = c.clone().addmm_(a, b, alpha=3)
    actual = on(c)
    actual.addmm_(on(a), on(b), alpha=3)
    assert torch.equal(actual.cpu(), expected)
    out = torch.empty(0, device=DEV)
    torch.addmm(on(c), on(a), on(b), out=out)
    assert out.shape == (4, 4) and torch.equal(out.cpu(), torch.addmm(c, a, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.complex64, torch.complex128, torch.int64])
def test_other_dtypes_run_cpus_kernel(dtype):
    a = (torch.randn(4, 3) * 4).to(dtype)
    b = (torch.randn(3, 5) * 4).to(dtype)
    same_as_cpu(torch.mm, a, b)
    same_as_cpu(torch.addmm, (torch.randn(5) * 4).to(dtype), a, b)


def test_conjugate_views_run_cpus_kernel():
    a = torch.randn(3, 3, dtype=torch.complex64)
    b = torch.randn(3, 3, dtype=torch.complex64)
    expected = torch.mm(a.conj(), b)
    assert torch.equal(torch.mm(on(a).conj(), on(b)).cpu(), expected)


def test_reduced_precision_float32_mode_runs_cpus_kernel():
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        same_as_cpu(torch.mm, a, b)
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before


def test_zero_size_and_empty_contraction():
    same_as_cpu(torch.mm, torch.randn(0, 3), torch.randn(3, 4))
    same_as_cpu(torch.mm, torch.randn(3, 0), torch.randn(0, 4))
    same_as_cpu(torch.addmm, torch.randn(3, 4), torch.randn(3, 0), torch.randn(0, 4))


def test_mm_and_addmm_errors():
    a = torch.ones(2, 3, device=DEV)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(a, a)
    with pytest.raises(RuntimeError, match="same device.*openreg:0 and cpu"):
        torch.mm(a, torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="same device.*openreg:0 and openreg:1"):
        torch.mm(a, torch.ones(3, 2, device="openreg:1"))
    with pytest.raises(RuntimeError, match="dtype"):
        torch.mm(a, torch.ones(3, 2, device=DEV, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype"):
        torch.mm(a, a.t(), out=torch.empty(2, 2, dtype=torch.float64, device=DEV))
    # A 0-dim CPU bias is accepted, as on CUDA.
    r = torch.addmm(torch.tensor(1.0), a, a.t())
    assert r.device.type == DEV and torch.equal(r.cpu(), torch.full((2, 2), 4.0))
    assert torch.equal((a @ a.t()).cpu(), torch.full((2, 2), 3.0))  # the device still works


def test_mm_and_addmm_gradients_match_cpu():
    c, a, b = torch.randn(3, 4), torch.randn(3, 5), torch.randn(5, 4)
    grads = []
    for dev in ("cpu", DEV):
        xs = [t.detach().to(dev).requires_grad_() for t in (c, a, b)]
        (torch.addmm(*xs) * 2 + torch.mm(xs[1], xs[2])).sum().backward()
        grads.append([x.grad.cpu() for x in xs])
    for g_cpu, g_dev in zip(*grads):
        assert torch.equal(g_dev, g_cpu)


def test_mm_on_a_second_device_runs_there():
    a = torch.randn(4, 4)
    with torch.openreg.device(0):
        r = torch.mm(a.to("openreg:1"), a.to("openreg:1"))
    assert r.device == torch.device("openreg:1")
    assert torch.equal(r.cpu(), a @ a)


# --- bmm / baddbmm --------------------------------------------------------------------


BATCHED = [(1, 4, 4, 4), (3, 2, 5, 3), (2, 1, 1, 1), (2, 9, 9, 9)]  # the last: CPU's kernel (BLAS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.complex64])
@pytest.mark.parametrize("shape", BATCHED, ids=str)
def test_bmm_and_baddbmm_are_cpus_bit_for_bit(shape, dtype):
    b, m, k, n = shape
    g = torch.Generator().manual_seed(b * 1000 + m * 100 + k * 10 + n)
    x = (torch.randn(b, m, k, generator=g) * 4).to(dtype)
    y = (torch.randn(b, k, n, generator=g) * 4).to(dtype)
    bias = (torch.randn(b, m, n, generator=g) * 4).to(dtype)
    for xx, yy in ((x, y), (x.transpose(1, 2).contiguous().transpose(1, 2), y[:, :, :]), (x, y.permute(2, 1, 0).contiguous().permute(2, 1, 0))):
        same_as_cpu(torch.bmm, xx, yy)
        same_as_cpu(torch.matmul, xx, yy)
        same_as_cpu(torch.baddbmm, bias, xx, yy)
        same_as_cpu(torch.baddbmm, bias[:1], xx, yy)  # broadcast bias
        same_as_cpu(lambda c, p, q: torch.baddbmm(c, p, q, beta=2, alpha=3), bias, xx, yy)
        same_as_cpu(lambda c, p, q: torch.baddbmm(c, p, q, beta=0), bias, xx, yy)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_bmm_runs_cpus_kernel(dtype):
    x, y = torch.randn(2, 3, 4).to(dtype), torch.randn(2, 4, 5).to(dtype)
    same_as_cpu(torch.bmm, x, y)
    same_as_cpu(torch.baddbmm, torch.randn(2, 3, 5).to(dtype), x, y)


def test_bmm_in_place_out_and_errors():
    c, x, y = torch.randn(2, 3, 3), torch.randn(2, 3, 4), torch.randn(2, 4, 3)
    actual = on(c)
    actual.baddbmm_(on(x), on(y), alpha=0.5)
    assert torch.equal(actual.cpu(), c.clone().baddbmm_(x, y, alpha=0.5))
    out = torch.empty(0, device=DEV)
    assert torch.bmm(on(x), on(y), out=out) is out and torch.equal(out.cpu(), torch.bmm(x, y))
    same_as_cpu(torch.bmm, torch.randn(0, 3, 4), torch.randn(0, 4, 2))
    same_as_cpu(torch.bmm, torch.randn(2, 3, 0), torch.randn(2, 0, 2))
    with pytest.raises(RuntimeError, match="same device.*openreg:0 and cpu"):
        torch.bmm(on(x), y)
    with pytest.raises(RuntimeError, match="batch1 must be a 3D tensor"):
        torch.bmm(on(x)[0], on(y))
    assert torch.equal(torch.bmm(on(x), on(y)).cpu(), torch.bmm(x, y))


def test_bmm_gradients_match_cpu():
    c, x, y = torch.randn(2, 3, 3), torch.randn(2, 3, 4), torch.randn(2, 4, 3)
    grads = []
    for dev in ("cpu", DEV):
        ts = [t.detach().to(dev).requires_grad_() for t in (c, x, y)]
        (torch.baddbmm(*ts) + torch.bmm(ts[1], ts[2])).sum().backward()
        grads.append([t.grad.cpu() for t in ts])
    for g_cpu, g_dev in zip(*grads):
        assert torch.equal(g_dev, g_cpu)


# --- cat ----------------------------------------------------------------------------


def test_cat_matches_cpu():
    a, b, c = torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 5)
    cases = [
        ((a, b), 0),
        ((a, c), 1),
        ((a, c), -1),
        ((a.t(), b.t()), 1),  # non-contiguous: copy_ per operand
        ((a[:, ::2], a[:, 1::2]), 1),
        ((torch.empty(0), a, torch.empty(0)), 0),  # legacy empty operands are skipped
        ((torch.randn(0, 4), a), 0),
        ((a, a.double()), 0),  # type promotion
        ((a, torch.arange(4).reshape(1, 4)), 0),
        ((torch.randn(2, 3, 4), torch.randn(2, 1, 4), torch.randn(2, 2, 4)), 1),
        ((torch.randint(0, 9, (3, 3), dtype=torch.uint8), torch.randint(0, 9, (1, 3), dtype=torch.uint8)), 0),
        ((torch.randn(200, 200), torch.randn(200, 200)), 1),  # large: copy_ per operand
    ]
    for tensors, dim in cases:
        same_as_cpu(lambda *ts: torch.cat(ts, dim), *tensors)
    same_as_cpu(lambda *ts: torch.stack(ts, 1), a, a)
    same_as_cpu(lambda *ts: torch.stack(ts, 2), a, a)


def test_cat_keeps_channels_last():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    same_as_cpu(lambda *ts: torch.cat(ts, 1), x, x)


def test_cat_out_resizes_checks_and_writes_through_a_proxy():
    a, b = torch.randn(2, 3), torch.randn(1, 3)
    out = torch.empty(0, device=DEV)
    assert torch.cat([on(a), on(b)], out=out) is out
    assert torch.equal(out.cpu(), torch.cat([a, b]))
    strided = torch.empty(3, 6, device=DEV)[:, ::2]
    torch.cat([on(a), on(b)], out=strided)
    assert torch.equal(strided.cpu(), torch.cat([a, b]))
    with pytest.raises(TypeError, match="can.t be cast"):  # as on CPU
        torch.cat([on(a), on(b)], out=torch.empty(3, 3, dtype=torch.int64, device=DEV))


def test_cat_errors_keep_the_device_working():
    a = torch.ones(3, device=DEV)
    with pytest.raises(RuntimeError, match=r"aten::cat.*argument.*'tensors'.*\.to\(\"openreg:0\"\)"):
        torch.cat([a, torch.ones(3)])
    with pytest.raises(RuntimeError, match="openreg:0 and openreg:1"):
        torch.cat([a, torch.ones(3, device="openreg:1")])
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        torch.cat([torch.tensor(1.0, device=DEV)])
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([torch.ones(2, 2, device=DEV), torch.ones(2, 3, device=DEV)])
    assert torch.equal(torch.cat([a, a]).cpu(), torch.ones(6))


def test_cat_gradient_matches_cpu():
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    grads = []
    for dev in ("cpu", DEV):
        xs = [t.detach().to(dev).requires_grad_() for t in (a, b)]
        (torch.cat(xs) * torch.arange(18.0, device=dev).reshape(6, 3)).sum().backward()
        grads.append([x.grad.cpu() for x in xs])
    assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_cat_waits_for_a_copy_queued_on_its_stream():
    src = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
    s = torch.openreg.Stream()
    with torch.openreg.stream(s):
        dst = torch.empty(1 << 16, device=DEV)
        torch.openreg._sleep(20)
        dst.copy_(src, non_blocking=True)
        r = torch.cat([dst[:8], dst[:8]])
    assert torch.equal(r.cpu(), torch.cat([src[:8], src[:8]]))
