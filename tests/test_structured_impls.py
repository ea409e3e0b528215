"""Structured operators with an openreg impl() (`structured: impl:` in
backend_functions.yaml): cat, mm, addmm, bmm, baddbmm, gather and scatter.
torch's meta() checks and sizes; openreg's impl works on kernel addresses, and
hands what it cannot do to CPU's kernel. Both routes must give CPU's results bit
for bit."""

import warnings

import pytest
import torch
from torch.testing import assert_close

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

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


def test_addmm_copies_a_bias_of_any_layout_into_a_row_or_column_major_out():
    m, k, n = 8, 5, 7
    a, b = torch.randn(m, k), torch.randn(k, n)
    biases = {
        "row": torch.randn(n),
        "column": torch.randn(m, 1),
        "transposed": torch.randn(n, m).t(),
        "strided": torch.randn(m, 2 * n)[:, ::2],
        "expanded": torch.randn(n).expand(m, n),
    }
    for name, bias in biases.items():
        same_as_cpu(lambda c, x, y: torch.addmm(c, x, y, beta=0.5), bias, a, b)
        # Column-major out: the copy walks the columns.
        expected = torch.empty(n, m).t()
        torch.addmm(bias, a, b, beta=0.5, out=expected)
        out = torch.empty(n, m, device=DEV).t()
        torch.addmm(on(bias), on(a), on(b), beta=0.5, out=out)
        assert torch.equal(out.cpu(), expected), name


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


A_CPU_OPERAND = {  # refused as on CUDA, also where an empty result or a small product returns early
    "mm, empty": lambda d: torch.mm(torch.ones(0, 3, device=d), torch.ones(3, 2)),
    "addmm, empty": lambda d: torch.addmm(torch.ones(0, 2, device=d), torch.ones(0, 3, device=d), torch.ones(3, 2)),
    "bmm, empty": lambda d: torch.bmm(torch.ones(0, 2, 3), torch.ones(0, 3, 2, device=d)),
    "baddbmm, empty": lambda d: torch.baddbmm(torch.ones(2, 0, 2, device=d), torch.ones(2, 0, 3, device=d), torch.ones(2, 3, 2)),
    "baddbmm, small, self": lambda d: torch.baddbmm(torch.ones(2, 3, 4), torch.ones(2, 3, 5, device=d), torch.ones(2, 5, 4, device=d)),
    "baddbmm, small, self, beta=0": lambda d: torch.baddbmm(
        torch.ones(4), torch.ones(2, 3, 5, device=d), torch.ones(2, 5, 4, device=d), beta=0),
    "baddbmm, small, self, out=": lambda d: torch.baddbmm(
        torch.ones(2, 3, 4), torch.ones(2, 3, 5, device=d), torch.ones(2, 5, 4, device=d), out=torch.empty(2, 3, 4, device=d)),
    "gather, empty": lambda d: torch.gather(torch.ones(3, device=d), 0, torch.ones(0, dtype=torch.long)),
}


@pytest.mark.parametrize("name", list(A_CPU_OPERAND))
def test_a_cpu_operand_is_refused(name):
    with pytest.raises(RuntimeError, match="same device.*openreg:0 and cpu"):
        A_CPU_OPERAND[name](DEV)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_baddbmm_on_cpus_kernel_out_in_place_and_conjugates(dtype):
    """Products too large for the small loops run CPU's impl after openreg's
    meta() copied self into out: out= of another layout, in-place with NaN and
    beta=0 (self is ignored), conjugate operands and output."""
    g = torch.Generator().manual_seed(7)
    x, y, c = ((torch.randn(*s, generator=g) * 4).to(dtype) for s in ((3, 9, 8), (3, 8, 10), (3, 9, 10)))
    out_t = torch.full((3, 10, 9), 5.0, dtype=dtype).transpose(1, 2)
    actual = on(out_t)
    torch.baddbmm(on(c), on(x), on(y), beta=2, alpha=0.5, out=actual)
    expected = torch.baddbmm(c, x, y, beta=2, alpha=0.5, out=out_t.clone())
    assert actual.stride() == expected.stride() and torch.equal(actual.cpu(), expected)
    nan = torch.full_like(c, float("nan"))
    actual, expected = on(nan), nan.clone()
    actual.baddbmm_(on(x), on(y), beta=0)
    assert torch.equal(actual.cpu(), expected.baddbmm_(x, y, beta=0))
    if dtype.is_complex:
        same_as_cpu(lambda a, p, q: torch.baddbmm(a.conj(), p.conj(), q), c, x, y)
        expected = c.clone().conj()
        actual = on(c).conj()
        actual.baddbmm_(on(x), on(y).conj(), alpha=2)
        expected.baddbmm_(x, y.conj(), alpha=2)
        assert actual.is_conj() and torch.equal(actual.resolve_conj().cpu(), expected.resolve_conj())


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
        ((a.t(), b.t()), 1),  # non-contiguous: CPU's copy kernel per operand
        ((a[:, ::2], a[:, 1::2]), 1),
        ((torch.empty(0), a, torch.empty(0)), 0),  # legacy empty operands are skipped
        ((torch.randn(0, 4), a), 0),
        ((a, a.double()), 0),  # type promotion
        ((a, torch.arange(4).reshape(1, 4)), 0),
        ((torch.randn(2, 3, 4), torch.randn(2, 1, 4), torch.randn(2, 2, 4)), 1),
        ((torch.randint(0, 9, (3, 3), dtype=torch.uint8), torch.randint(0, 9, (1, 3), dtype=torch.uint8)), 0),
        ((torch.randn(200, 200), torch.randn(200, 200)), 1),  # large: CPU's copy kernel per operand
        ((torch.randn(3, 2).t(), torch.randn(2, 2).int()), 1),  # non-contiguous and promoted
    ]
    for tensors, dim in cases:
        same_as_cpu(lambda *ts: torch.cat(ts, dim), *tensors)
    same_as_cpu(lambda *ts: torch.stack(ts, 1), a, a)
    same_as_cpu(lambda *ts: torch.stack(ts, 2), a, a)


def test_cat_makes_no_copy_calls():
    """As CPU's and CUDA's cat: operands that are slices (a rotary embedding's
    cat((-x2, x1))) or a skipped empty operand (a key/value cache's first
    cat) are copied inside cat, not by a dispatched copy_ per operand."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(2, 4, 8, 16, device=DEV)
    cache = torch.tensor([], device=DEV)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        rotated = torch.cat((-x[..., 8:], x[..., :8]), dim=-1)
        cached = torch.cat([cache, x], dim=-2)
        transposed = torch.cat([x.transpose(1, 2), x.transpose(1, 2)], dim=1)
    names = [e.name for e in prof.events()]
    assert "aten::copy_" not in names and "aten::_copy_from" not in names
    xc = x.cpu()
    assert torch.equal(rotated.cpu(), torch.cat((-xc[..., 8:], xc[..., :8]), dim=-1))
    assert torch.equal(cached.cpu(), xc)
    assert torch.equal(transposed.cpu(), torch.cat([xc.transpose(1, 2)] * 2, dim=1))


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
    torch.openreg.current_stream().wait_stream(s)  # r is s's work
    assert torch.equal(r.cpu(), torch.cat([src[:8], src[:8]]))


# --- gather / scatter -----------------------------------------------------------
# Small operands move their elements on kernel addresses; larger ones, other
# dtypes and bad indices go to CPU's kernel. Both must be CPU's bit for bit.

GATHER_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
                 torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def column_major(shape, dtype, device="cpu"):
    """An empty tensor of `shape` whose first dimension is the densest: a strided out=."""
    return torch.empty(tuple(reversed(shape)), dtype=dtype, device=device).permute(*reversed(range(len(shape))))


def gather_cases(dtype, index_dtype):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 6, 7, generator=g).mul(10).to(dtype)
    for dim in (0, 1, 2, -1):
        size = x.shape[dim]
        shape = [4, 5, 6]
        shape[dim] = 9  # longer than the dimension along dim: repeated positions
        index = torch.randint(0, size, shape, generator=g).to(index_dtype)
        yield f"dim {dim}", x, dim, index
        # Strided operands: a transposed self, a sliced index.
        yield f"dim {dim} transposed", x.transpose(0, 2).contiguous().transpose(0, 2), dim, index
        yield f"dim {dim} sliced index", x, dim, index[:, ::2]
    yield "1-d", x.flatten(), 0, torch.randint(0, 210, (50,), generator=g).to(index_dtype)
    yield "large", torch.randn(300, 200, generator=g).to(dtype), 1, torch.randint(0, 200, (300, 150), generator=g)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", GATHER_DTYPES, ids=str)
def test_gather_is_cpus_bit_for_bit(dtype, index_dtype):
    for name, x, dim, index in gather_cases(dtype, index_dtype):
        same_as_cpu(lambda a, i: torch.gather(a, dim, i), x, index)
        out = column_major(index.shape, dtype)
        expected = torch.gather(x, dim, index, out=out)
        dev_out = column_major(index.shape, dtype, DEV)
        torch.gather(on(x), dim, on(index), out=dev_out)
        assert torch.equal(dev_out.cpu(), expected), name


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", GATHER_DTYPES, ids=str)
def test_scatter_is_cpus_bit_for_bit(dtype, index_dtype):
    g = torch.Generator().manual_seed(8)
    for name, x, dim, index in gather_cases(dtype, index_dtype):
        # Positions written twice keep the value CPU writes last.
        src_shape = [s + 1 for s in index.shape]
        src = torch.randn(src_shape, generator=g).mul(10).to(dtype)
        same_as_cpu(lambda a, i, s: torch.scatter(a, dim, i, s), x, index, src)
        same_as_cpu(lambda a, i: torch.scatter(a, dim, i, 3), x, index)
        for value in (src, 3):
            expected = x.clone().scatter_(dim, index, value)
            actual = on(x)
            r = actual.scatter_(dim, on(index), on(value) if isinstance(value, torch.Tensor) else value)
            assert r is actual and torch.equal(actual.cpu(), expected), name
            out, dev_out = column_major(x.shape, dtype), column_major(x.shape, dtype, DEV)
            torch.scatter(x, dim, index, value, out=out)
            torch.scatter(on(x), dim, on(index), on(value) if isinstance(value, torch.Tensor) else value, out=dev_out)
            assert torch.equal(dev_out.cpu(), out), name


def test_scatter_value_converts_like_cpu():
    x = torch.zeros(3, 4, dtype=torch.int8)
    index = torch.tensor([[0, 1], [2, 3]])
    raises_in_kernel_like_cpu(lambda t, i: t.scatter(1, i, 300), x, index)
    # out= holds self's values when the conversion fails, as CPU copies them first.
    outs = {"cpu": torch.full((3, 4), 9, dtype=torch.int8), DEV: torch.full((3, 4), 9, dtype=torch.int8, device=DEV)}
    for dev, out in outs.items():
        with pytest.raises(RuntimeError, match="out of range|overflow"):
            torch.scatter((x + 1).to(dev), 1, index.to(dev), 300, out=out)
            torch.openreg.synchronize()
    assert torch.equal(outs[DEV].cpu(), outs["cpu"])
    same_as_cpu(lambda t, i: t.scatter(1, i, 2.7), x, index)
    same_as_cpu(lambda t, i: t.bool().scatter(1, i, 2.7), x, index)


def raises_like_cpu(fn, *args):
    with pytest.raises(Exception) as cpu_error:
        fn(*args)
    with pytest.raises(type(cpu_error.value)) as error:
        fn(*(on(a) for a in args))
    assert str(error.value).splitlines()[0] == str(cpu_error.value).splitlines()[0]


def raises_in_kernel_like_cpu(fn, *args):
    """raises_like_cpu for an error CPU's kernel raises from the data (an index
    out of bounds, a value that overflows): on openreg, as on CUDA, the kernel
    reports it at the next synchronising call, as torch.AcceleratorError with
    CPU's message, or the call raises CPU's exception itself (a first launch,
    OPENREG_LAUNCH_BLOCKING=1)."""
    with pytest.raises(Exception) as cpu_error:
        fn(*args)
    with pytest.raises((type(cpu_error.value), torch.AcceleratorError)) as error:
        fn(*(on(a) for a in args))
        torch.openreg.synchronize()
    assert str(cpu_error.value).splitlines()[0] in str(error.value)


def test_gather_and_scatter_errors_are_cpus():
    x = torch.randn(4, 5)
    # Several bad indices: the error names the one CPU finds first.
    bad = torch.tensor([[0, 9, 1], [-1, 2, 7], [0, 0, 0]])
    for dim in (0, 1):
        raises_in_kernel_like_cpu(lambda t, i: torch.gather(t, dim, i), x, bad)
        raises_in_kernel_like_cpu(lambda t, i: torch.scatter(t, dim, i, 1.0), x, bad)
        raises_in_kernel_like_cpu(lambda t, i, s: torch.scatter(t, dim, i, s), x, bad, torch.ones(3, 3))
    raises_like_cpu(lambda t, i: torch.gather(t, 1, i), x, torch.zeros(2, 2))  # float index
    raises_like_cpu(lambda t, i: torch.gather(t, 1, i), x, torch.zeros(2, 2, 2, dtype=torch.long))
    raises_like_cpu(lambda t, i, s: torch.scatter(t, 1, i, s), x, torch.zeros(2, 2, dtype=torch.long),
                    torch.ones(2, 2, dtype=torch.float64))
    raises_like_cpu(lambda t, i: torch.gather(t.to(torch.uint16), 1, i), x, torch.zeros(2, 2, dtype=torch.long))
    # After a bad index the tensor holds what CPU's holds (CPU's kernel writes
    # up to the bad index), and the device keeps working.
    y, expected = on(x), x.clone()
    for t, i in ((y, on(bad)), (expected, bad)):
        with pytest.raises(RuntimeError, match="out of bounds"):
            t.scatter_(1, i, 5.0)
            torch.openreg.synchronize()
    assert torch.equal(y.cpu(), expected)
    assert torch.equal(torch.gather(y, 1, on(bad.clamp(0, 4))).cpu(), torch.gather(expected, 1, bad.clamp(0, 4)))


def test_gather_and_scatter_check_devices():
    x, index = on(torch.randn(3, 3)), torch.zeros(3, 3, dtype=torch.long)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.gather(x, 0, index)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.scatter(x, 0, on(index), torch.ones(3, 3))


def test_gather_and_scatter_zero_size_and_scalars():
    x = torch.randn(3, 4)
    same_as_cpu(lambda t, i: torch.gather(t, 1, i), x, torch.zeros(3, 0, dtype=torch.long))
    same_as_cpu(lambda t, i: torch.scatter(t, 1, i, 2.0), x, torch.zeros(3, 0, dtype=torch.long))
    same_as_cpu(lambda t, i: torch.gather(t, 0, i), torch.tensor(2.5), torch.tensor([0]))
    same_as_cpu(lambda t, i: torch.scatter(t, 0, i, 1.0), torch.tensor(2.5), torch.tensor(0))


def test_scatter_out_overlapping_self_runs_cpus_kernel():
    base = torch.arange(12.0)
    index = torch.tensor([[0, 1]])
    raises_like_cpu(lambda b, i: torch.scatter(b[:6].view(2, 3), 1, i, -1.0, out=b[2:8].view(2, 3)), base, index)
    # A column of itself: the same memory, no copy needed.
    expected = base.clone().view(3, 4)
    torch.scatter(expected, 1, index, -1.0, out=expected)
    actual = on(base).view(3, 4)
    torch.scatter(actual, 1, on(index), -1.0, out=actual)
    assert torch.equal(actual.cpu(), expected)


def test_gather_and_scatter_gradients_match_cpu():
    x, index = torch.randn(4, 5), torch.tensor([[0, 1, 1], [4, 4, 0], [2, 3, 2], [0, 0, 0]])
    src = torch.randn(4, 3)
    grads = []
    for dev in ("cpu", DEV):
        a = x.detach().to(dev).requires_grad_()
        s = src.detach().to(dev).requires_grad_()
        (torch.gather(a, 1, index.to(dev)).pow(2).sum() + torch.scatter(a, 1, index.to(dev), s).pow(3).sum()).backward()
        grads.append((a.grad.cpu(), s.grad.cpu()))
    assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_gather_and_scatter_resolve_conjugate_and_negative_views():
    x = torch.randn(4, 5, dtype=torch.complex64)
    index = torch.tensor([[0, 1, 1], [4, 4, 0], [2, 3, 2], [0, 0, 0]])
    src = torch.randn(4, 3, dtype=torch.complex64)
    same_as_cpu(lambda a, i: torch.gather(a.conj(), 1, i), x, index)
    same_as_cpu(lambda a, i, s: torch.scatter(a.conj(), 1, i, s.conj()), x, index, src)
    same_as_cpu(lambda a, i, s: torch.scatter(torch._neg_view(a), 1, i, torch._neg_view(s)), x.real, index, src.real)


def test_gather_and_scatter_out_of_another_dtype_or_shape():
    x, index = torch.randn(4, 5), torch.tensor([[0, 1, 1], [4, 4, 0]])
    raises_like_cpu(lambda t, i, o: torch.gather(t, 1, i, out=o), x, index, torch.empty(2, 3, dtype=torch.float64))
    raises_like_cpu(lambda t, i, o: torch.scatter(t, 1, i, 2.0, out=o), x, index, torch.empty(4, 5, dtype=torch.int64))
    # An out= of another shape is resized, as on CPU, with CPU's warning for a non-empty one.
    def run(op, dev, out):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            op(on(x) if dev == DEV else x, out)
        return out.cpu(), [str(w.message).split(".")[0] for w in caught]

    for op in (lambda t, o: torch.gather(t, 1, index.to(t.device), out=o),
               lambda t, o: torch.scatter(t, 0, index.clamp(max=3).to(t.device), 2.0, out=o)):
        for size in (0, 7):
            expected, cpu_warnings = run(op, "cpu", torch.empty(size))
            actual, warnings_ = run(op, DEV, torch.empty(size, device=DEV))
            assert actual.shape == expected.shape and torch.equal(actual, expected)
            assert warnings_ == cpu_warnings and len(cpu_warnings) == (size > 0)
