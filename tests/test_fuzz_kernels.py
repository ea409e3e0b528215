"""Fuzzing the native kernels against CPU: random shapes (zero-size included),
dtypes, non-contiguous layouts (transposes, strided slices, storage offsets,
broadcast views) and special values, through the structured operators and
DispatchStubs of backend_functions.yaml: functional, out= and in-place variants
give CPU's values, dtypes and shapes, and where CPU raises, openreg raises the
same exception type. Derandomized and without an example database, so CI runs
the same examples every time."""

import gc
import warnings

import pytest
import torch
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close, make_tensor

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),  # no "explain": it reruns a failure many times
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64]

# Structured groups and stubs bound in backend_functions.yaml.
UNARY = ["neg", "exp", "sin", "cos", "tanh", "sqrt", "rsqrt", "floor", "ceil", "trunc", "round", "frac", "sigmoid",
         "erf", "erfinv", "log", "log1p", "expm1", "reciprocal", "sign", "sgn", "signbit", "bitwise_not", "atan",
         "acos", "asinh", "digamma", "lgamma", "i0", "isposinf", "isneginf", "exp2", "log2"]
BINARY = ["add", "sub", "mul", "div", "div_floor", "div_trunc", "maximum", "minimum", "fmax", "fmin", "atan2",
          "pow", "fmod", "remainder", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or",
          "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "logaddexp", "copysign", "hypot",
          "nextafter", "xlogy", "heaviside", "gcd", "lcm", "add_alpha", "sub_alpha", "lerp"]
REDUCTIONS = ["sum", "prod", "amax", "amin", "all", "any", "max", "sum_dtype"]

BINARY_FN = {
    "div_floor": lambda a, b, **kw: torch.div(a, b, rounding_mode="floor", **kw),
    "div_trunc": lambda a, b, **kw: torch.div(a, b, rounding_mode="trunc", **kw),
    "add_alpha": lambda a, b, **kw: torch.add(a, b, alpha=2, **kw),
    "sub_alpha": lambda a, b, **kw: torch.sub(a, b, alpha=3, **kw),
    "lerp": lambda a, b, **kw: torch.lerp(a, b, 0.25, **kw),
}


@st.composite
def tensors(draw, shape=None, dtype=None):
    """(cpu tensor, a function that makes the same view of a copy on another
    device): the same values, sizes and strides on both."""
    dtype = dtype if dtype is not None else draw(st.sampled_from(DTYPES))
    shape = shape if shape is not None else draw(st.lists(st.integers(0, 5), max_size=4))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided", "offset", "expanded"]))
    seed = draw(st.integers(0, 2**31 - 1))
    base_shape = list(shape)
    if layout == "strided" and shape:
        base_shape[-1] = 2 * shape[-1]
    if layout == "offset":
        base_shape = [s + 1 for s in shape]
    if layout == "transposed":
        base_shape = base_shape[::-1]
    if layout == "expanded" and shape:
        base_shape[0] = 1
    torch.manual_seed(seed)
    low, high = (-9, 9) if dtype not in (torch.uint8, torch.bool) else (None, None)
    base = make_tensor(base_shape, dtype=dtype, device="cpu", low=low, high=high)
    if dtype.is_floating_point and base.numel() and draw(st.booleans()):
        flat = base.view(-1)
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, flat.numel() - 1))
            flat[at] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.0, 0.0]))

    def view(t):
        if layout == "strided" and shape:
            return t[..., ::2]
        if layout == "offset":
            return t[tuple(slice(1, None) for _ in shape)]
        if layout == "transposed":
            return t.permute(tuple(reversed(range(t.dim()))))
        if layout == "expanded" and shape:
            return t.expand(*shape)
        return t

    cpu = view(base)
    assert list(cpu.shape) == list(shape)
    event(f"layout {layout}")
    # A fresh copy for every run, so in-place variants do not write `base`.
    return cpu, lambda device: view(base.to(device, copy=True))


def broadcast_shape(draw, shape):
    """A shape that broadcasts with `shape` (or, one time in eight, need not)."""
    if draw(st.integers(0, 7)) == 0:
        return draw(st.lists(st.integers(0, 5), max_size=4))
    out = [draw(st.sampled_from([s, 1])) for s in shape]
    return out[draw(st.integers(0, len(out))):]


def same_outcome(run):
    """run(device) on "cpu" and on DEV: equal results, or the same exception type."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # resize warnings of out=, complex casts
        try:
            expected = run("cpu")
        except Exception as e:  # noqa: BLE001 - CPU is the oracle
            event(f"raises {type(e).__name__}")
            with pytest.raises(type(e)):
                run(DEV)
            return
        got = run(DEV)
    event("computes")
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for e, g in zip(expected, got, strict=True):
        assert g.device.type == "openreg"
        assert g.stride() == e.stride() or g.numel() <= 1 or not e.is_contiguous()
        assert_close(g.cpu(), e, equal_nan=True, atol=None if e.dtype != torch.bfloat16 else 1e-2,
                     rtol=None if e.dtype != torch.bfloat16 else 1e-2)


@pytest.fixture(autouse=True, scope="module")
def _no_leaks():
    gc.collect()
    before = torch.openreg.memory_allocated(0)
    yield
    gc.collect()
    assert torch.openreg.memory_allocated(0) == before


@settings(FUZZ, max_examples=250)
@given(data=st.data(), name=st.sampled_from(UNARY), variant=st.sampled_from(["functional", "out", "inplace"]))
def test_unary_kernels_match_cpu(data, name, variant):
    x, make = data.draw(tensors())
    out_dtype = data.draw(st.sampled_from(DTYPES))
    fn = getattr(torch, name)

    def run(device):
        t = make(device)
        if variant == "out":
            out = torch.empty(data_shape_out, dtype=out_dtype, device=device)
            r = fn(t, out=out)
            assert r is out
            return out
        if variant == "inplace":  # on the view itself: strided, offset or (raising) expanded
            getattr(t, name + "_")()
            return t
        return fn(t)

    data_shape_out = data.draw(st.sampled_from([list(x.shape), [0], [1]]))
    same_outcome(run)


@settings(FUZZ, max_examples=350)
@given(data=st.data(), name=st.sampled_from(BINARY),
       variant=st.sampled_from(["functional", "functional", "scalar", "out", "inplace"]))
def test_binary_kernels_with_broadcasting_and_promotion_match_cpu(data, name, variant):
    a, make_a = data.draw(tensors())
    b_shape = broadcast_shape(data.draw, list(a.shape))
    b, make_b = data.draw(tensors(shape=b_shape))
    scalar = data.draw(st.sampled_from([2, -3, 0.5, True, 1 + 2j, 0]))
    out_dtype = data.draw(st.sampled_from(DTYPES))
    fn = BINARY_FN.get(name) or getattr(torch, name)

    def run(device):
        x, y = make_a(device), make_b(device)
        if variant == "scalar":
            return fn(x, scalar)
        if variant == "out":
            out = torch.empty(0, dtype=out_dtype, device=device)
            fn(x, y, out=out)
            return out
        if variant == "inplace":
            method = getattr(x, (name if name not in BINARY_FN else name.split("_")[0]) + "_", None)
            if method is None or name in BINARY_FN:
                return fn(x, y, out=x)
            method(y)
            return x
        return fn(x, y)

    same_outcome(run)


@settings(FUZZ, max_examples=200)
@given(data=st.data(), name=st.sampled_from(REDUCTIONS), keepdim=st.booleans())
def test_reductions_over_dims_match_cpu(data, name, keepdim):
    x, make = data.draw(tensors())
    ndim = max(x.dim(), 1)
    dims = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                               st.lists(st.integers(-ndim, ndim - 1), max_size=3)))
    dtype = data.draw(st.sampled_from([None, torch.float64, torch.int64, torch.float16]))

    def run(device):
        t = make(device)
        if name in ("sum", "amax", "amin") and dims is not None:
            return getattr(torch, name)(t, dims, keepdim=keepdim)
        if name == "sum_dtype":
            return torch.sum(t, dims if dims is not None else [], keepdim=keepdim, dtype=dtype)
        single = dims if isinstance(dims, int) else (dims[0] if dims else None)
        if single is None:
            return getattr(torch, name)(t)
        if name == "max":
            values, indices = torch.max(t, single, keepdim=keepdim)
            return values, indices
        if name == "prod":
            return torch.prod(t, single, keepdim=keepdim, dtype=dtype)
        return getattr(torch, name)(t, single, keepdim=keepdim)

    same_outcome(run)


# Found by the fuzzer: CPU kernels read a 0-dim operand of another dtype from
# the iterator's original tensor (TensorIteratorBase::original_scalar_value)
# when the common dtype is BFloat16 or Half; that tensor was the device tensor,
# and reading it ended the process ("host code accessed device memory").
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("other", [torch.int32, torch.int64, torch.float32, torch.float64, torch.bool])
@pytest.mark.parametrize("op", [torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.atan2])
def test_zero_dim_device_operand_of_another_dtype_matches_cpu(dtype, other, op):
    x = torch.tensor([1.5, -2.0, 300.0, 0.0], dtype=dtype)
    s = torch.tensor(257, dtype=other) if other is not torch.bool else torch.tensor(True)  # 257 is not a bfloat16
    for run in (
        lambda device: op(x.to(device), s.to(device)),
        lambda device: op(x.to(device)[0], s.to(device)),
        lambda device: op(x.to(device), s.to(device), out=torch.empty(4, dtype=dtype, device=device)),
    ):
        try:
            expected = run("cpu")
        except RuntimeError as e:  # bool - bool
            with pytest.raises(RuntimeError, match=str(e).split(".")[0]):
                run(DEV)
            continue
        got = run(DEV)
        # Exactly CPU's values: the scalar is read in its own dtype, not rounded to `dtype` first.
        assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected), (got, expected)
