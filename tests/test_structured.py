"""Structured groups and DispatchStub kernels bound in backend_functions.yaml,
each compared with CPU: functional, in-place and out= variants, broadcasting,
non-contiguous operands, type promotion, zero-size inputs, and out= tensors of
the wrong shape, dtype or layout."""

import gc
import os
import warnings

import pytest
import torch
from torch.testing import assert_close

from codegen.load import load
from codegen.model import Route

MODES = ("trace",)  # the extra CI passes that run this file (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV = "openreg"

# out= operator -> a call of it (functional, or out= when given out=...).
BINARY = {
    "add.out": lambda a, b, **out: torch.add(a, b, alpha=2, **out),
    "sub.out": lambda a, b, **out: torch.sub(a, b, alpha=3, **out),
    "mul.out": torch.mul,
    "div.out": torch.div,
    "maximum.out": torch.maximum,
    "minimum.out": torch.minimum,
    "heaviside.out": torch.heaviside,
    "eq.Tensor_out": torch.eq,
    "lt.Tensor_out": torch.lt,
    "pow.Tensor_Tensor_out": torch.pow,
}
UNARY = {
    "neg.out": torch.neg,
    "exp.out": torch.exp,
    "sqrt.out": torch.sqrt,
    "sigmoid.out": torch.sigmoid,
    "tanh.out": torch.tanh,
}
REDUCTIONS = {
    "prod.int_out": lambda a: torch.prod(a, dim=1),
    "max.dim_max": lambda a: torch.max(a, dim=1),
    "sum.IntList_out": lambda a: torch.sum(a, dim=1),
    "amax.out": lambda a: torch.amax(a, dim=0),
    "amin.out": lambda a: torch.amin(a, dim=0),
    "any.dims_out": lambda a: torch.any(a > 0, dim=1),
    "all.dims_out": lambda a: torch.all(a > 0, dim=(0, 1)),
    "argmax.out": lambda a: torch.argmax(a, dim=0),
    "argmin.out": lambda a: torch.argmin(a, dim=0),
    "eq.Scalar_out": lambda a: torch.eq(a, 1.0),
}
# Backward groups, reached through autograd of these forward functions.
BACKWARD = {
    "tanh_backward.grad_input": torch.tanh,
    "sigmoid_backward.grad_input": torch.sigmoid,
    "silu_backward.grad_input": torch.nn.functional.silu,
    "hardsigmoid_backward.grad_input": torch.nn.functional.hardsigmoid,
    "gelu_backward.grad_input": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "elu_backward.grad_input": torch.nn.functional.elu,
    "leaky_relu_backward.grad_input": lambda x: torch.nn.functional.leaky_relu(x, 0.2),
    "softplus_backward.grad_input": lambda x: torch.nn.functional.softplus(x, beta=2.0),
    "hardshrink_backward.grad_input": lambda x: torch.nn.functional.hardshrink(x, 0.7),
    "softshrink_backward.grad_input": lambda x: torch.nn.functional.softshrink(x, 0.7),
    "threshold_backward.grad_input": lambda x: torch.nn.functional.threshold(x, 0.5, -1.0),
    "logit_backward.grad_input": lambda x: torch.logit(torch.sigmoid(x), eps=1e-6),
}
# Each stub and an operator whose openreg kernel reaches it.
STUB_REACHED_BY = {
    "add_stub": "add.out", "mul_stub": "mul.out", "div_true_stub": "div.out",
    "maximum_stub": "maximum.out", "minimum_stub": "minimum.out", "heaviside_stub": "heaviside.out",
    "eq_stub": "eq.Tensor_out", "lt_stub": "lt.Tensor_out", "pow_tensor_tensor_stub": "pow.Tensor_Tensor_out",
    "neg_stub": "neg.out", "exp_stub": "exp.out", "sqrt_stub": "sqrt.out", "sigmoid_stub": "sigmoid.out",
    "tanh_stub": "tanh.out", "prod_stub": "prod.int_out", "max_stub": "max.dim_max", "fill_stub": "fill_.Scalar",
}

CONFIG = load(os.path.join(ROOT, "backend_functions.yaml"))


def positive(*shape, dtype=torch.float32):
    return torch.rand(*shape, dtype=dtype) + 0.5


def on_device(*tensors):
    return [t.to(DEV) for t in tensors]


def assert_same(actual, expected):
    if isinstance(expected, tuple):
        for a, e in zip(actual, expected):
            assert_same(a, e)
        return
    assert actual.device.type == DEV
    assert actual.dtype == expected.dtype
    assert_close(actual.cpu(), expected, equal_nan=True)


def test_stubs_named_here_are_bound_in_the_yaml():
    bound = {st.decl.name for st in CONFIG.stubs}
    assert set(STUB_REACHED_BY) <= bound
    structured = {str(s.name) for s in CONFIG.structured}
    assert set(BINARY) | set(UNARY) | set(REDUCTIONS) | set(BACKWARD) <= structured


@pytest.mark.parametrize("name", sorted(BACKWARD))
def test_backward_groups_match_cpu_autograd(name):
    fn = BACKWARD[name]
    x = torch.randn(4, 5, dtype=torch.float64) * 3
    dx = x.to(DEV).requires_grad_()
    cx = x.clone().requires_grad_()
    grad = torch.randn(4, 5, dtype=torch.float64)
    fn(dx).backward(grad.to(DEV))
    fn(cx).backward(grad)
    assert_close(dx.grad.cpu(), cx.grad)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name.split('.')[0]}", "PrivateUse1")


@pytest.mark.parametrize("op", sorted({str(f.func.name) for s in CONFIG.structured for f in s.functions()}))
def test_structured_operators_have_an_openreg_kernel_not_the_fallback(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "PrivateUse1")


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_matches_cpu_with_broadcasting_and_non_contiguous_inputs(name):
    fn = BINARY[name]
    a, b = positive(6, 5), positive(5)
    assert_same(fn(*on_device(a, b)), fn(a, b))
    t = positive(5, 6).t()  # non-contiguous
    assert_same(fn(*on_device(t, b)), fn(t, b))
    assert_same(fn(*on_device(a[:, ::2], b[::2])), fn(a[:, ::2], b[::2]))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_promotes_types_like_cpu(name):
    fn = BINARY[name]
    i = torch.arange(1, 11, dtype=torch.int32).reshape(2, 5)
    f = positive(2, 5, dtype=torch.float64)
    for x, y in [(i, f), (f, i), (i, torch.tensor(2.5)), (i, torch.tensor(3, dtype=torch.int64))]:
        if name == "heaviside.out" and x.dtype != y.dtype:
            with pytest.raises(RuntimeError) as cpu_error:
                fn(x, y)
            with pytest.raises(RuntimeError, match=str(cpu_error.value).split(":")[0]):
                fn(x.to(DEV), y if y.dim() == 0 else y.to(DEV))
            continue
        # 0-dim CPU tensors are accepted next to device tensors, as on CUDA.
        dy = y if y.dim() == 0 else y.to(DEV)
        assert_same(fn(x.to(DEV), dy), fn(x, y))


@pytest.mark.parametrize("numel", [16, 40000])  # below and above the size cast in host memory
def test_bool_bytes_other_than_one_promote_as_true(numel):
    raw = torch.tensor([0, 1, 2, 200], dtype=torch.uint8).repeat(numel // 4)
    for fn in (torch.sin, torch.sqrt, lambda b: torch.atan2(b, b), lambda b: b * 1.5):
        expected = fn(raw.view(torch.bool))
        assert_close(fn(raw.to(DEV).view(torch.bool)).cpu(), expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("numel", [16, 40000])  # below and above the size cast in host memory
def test_promoted_device_inputs_of_every_layout_match_cpu(numel):
    # A stub kernel casts an input of another dtype to the common one (CpuIterator.cpp,
    # recast_keeping_strides): dense ones keep their strides, others are cast over
    # the memory they reach; small ones into host memory.
    rows = numel // 8
    base = torch.arange(2 * rows * 8, dtype=torch.int32).reshape(2 * rows, 8) % 7 - 3
    layouts = {
        "contiguous": lambda t: t[:rows],
        "transposed": lambda t: t[:rows].t().contiguous().t(),
        "strided": lambda t: t[::2],
        "expanded": lambda t: t[:1].expand(rows, 8),
        "empty": lambda t: t[:0],
    }
    for name, layout in layouts.items():
        i = layout(base)
        f = torch.randn(i.shape)
        mask = layout(base > 0)
        for fn, args in [(torch.add, (f, i)), (torch.mul, (i, f)), (torch.mul, (f, mask)), (torch.sub, (i, 2.5))]:
            dev_args = [a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args]
            # .to() makes contiguous copies; rebuild the layout on the device.
            dev_args = [layout(base.to(DEV)) if a is i else layout((base > 0).to(DEV)) if a is mask else d
                        for a, d in zip(args, dev_args)]
            assert_same(fn(*dev_args), fn(*args))
        # In place: the output's dtype is the common one, the input is cast.
        g = torch.zeros(i.shape, dtype=torch.float64)
        dg = g.to(DEV)
        dg.add_(layout(base.to(DEV)))
        assert_same(dg, g.add_(i))


PLAIN_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 1 / 3, 100.0, -128.0, 255.0, 65504.0, 65520.0, 1e-8, 3e38,
           2.0**24 + 1, 2.0**53 + 1, -(2.0**40) - 3, float("nan"), float("inf"), float("-inf"), 7.0]


def bits(t):
    """The tensor's bytes as integers: NaN payloads and -0.0 compare exactly."""
    t = t.cpu().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(torch.uint8) if t.dtype == torch.bool else t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                                                                      8: torch.int64}[t.element_size()])


def special_values(dtype):
    """SPECIAL as dtype (CPU's conversion; out-of-range values convert as CPU converts them)."""
    values = torch.tensor(SPECIAL, dtype=torch.float64)
    if not (dtype.is_floating_point or dtype.is_complex):
        values = values.nan_to_num(0.0, 0.0, 0.0).clamp(-(2.0**62), 2.0**62).to(torch.int64)
    return values.to(dtype)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "expanded"])
def test_promoting_casts_give_cpus_bits_for_every_dtype_pair(layout):
    # Small dense inputs are cast in one loop (CpuIterator.cpp, cast_dense), others
    # through to(); both must give the bits CPU's own cast gives.
    shape = {"contiguous": lambda t: t, "transposed": lambda t: t.reshape(4, 5).t(),
             "expanded": lambda t: t[:1].expand(20)}[layout]
    for first in PLAIN_DTYPES:
        a = special_values(first)
        for second in PLAIN_DTYPES:
            if second == first:
                continue
            b = special_values(second).flip(0)
            expected = torch.add(shape(a), shape(b))
            actual = torch.add(shape(a.to(DEV)), shape(b.to(DEV)))
            assert actual.dtype == expected.dtype and actual.stride() == expected.stride(), (first, second)
            assert torch.equal(bits(actual), bits(expected)), (first, second)
        # A Python number and a 0-dim CPU tensor, cast to the tensor's dtype.
        for other in (2.5, 1 / 3, 70000.0, torch.tensor(-0.1, dtype=torch.float64)):
            if first == torch.bool:
                continue
            assert torch.equal(bits(torch.mul(shape(a.to(DEV)), other)), bits(torch.mul(shape(a), other))), first


@pytest.mark.parametrize("dtype", PLAIN_DTYPES + [torch.complex32, torch.uint16])
def test_fill_gives_cpus_bits_for_every_dtype_and_layout(dtype):
    # Small dense tensors are filled directly (Fill.cpp, fill_dense); others,
    # and other dtypes, through CPU's fill kernel.
    layouts = {
        "contiguous": lambda t: t[:16],
        "channels_last": lambda t: t[:16].reshape(1, 2, 2, 4).contiguous(memory_format=torch.channels_last),
        "transposed": lambda t: t[:16].reshape(4, 4).t(),
        "strided": lambda t: t[::3],
        "one": lambda t: t[:1],
        "empty": lambda t: t[:0],
        "large": lambda t: t,
    }
    values = [2.5, -0.0, float("nan"), float("inf"), 1 / 3, 7, True, 70000.0, -1]
    if dtype.is_complex:
        values.append(1 - 2j)
    for name, layout in layouts.items():
        for value in values:
            if dtype == torch.uint16 and value in (-1, -0.0, 2.5, 1 / 3) or dtype == torch.complex32 and value == 70000.0:
                continue
            base = torch.zeros(40000, dtype=dtype)
            expected, actual = layout(base), layout(base.to(DEV))
            try:
                expected.fill_(value)
            except RuntimeError as error:  # a value the dtype cannot hold: the same error
                with pytest.raises(RuntimeError, match=str(error).split(" without")[0]):
                    actual.fill_(value)
                continue
            actual.fill_(value)
            assert actual.stride() == expected.stride()
            if dtype in (torch.complex32, torch.uint16):
                assert torch.equal(actual.cpu().contiguous().view(torch.int16),
                                   expected.contiguous().view(torch.int16)), (name, value)
            else:
                assert torch.equal(bits(actual), bits(expected)), (name, value)
    with pytest.raises(RuntimeError, match="value cannot be converted to type int8_t without overflow"):
        torch.zeros(4, dtype=torch.int8, device=DEV).fill_(1000)
    # Conjugate and negative views write the conjugate, the negation.
    if dtype in (torch.complex64, torch.complex128):
        base = torch.zeros(4, dtype=dtype, device=DEV)
        base.conj().fill_(1 - 2j)
        assert base.cpu().tolist() == [1 + 2j] * 4
    if dtype in (torch.float32, torch.float64):
        base = torch.zeros(4, dtype=dtype, device=DEV)
        base._neg_view().fill_(3)
        assert base.cpu().tolist() == [-3.0] * 4


def test_reduced_float_scalar_operand_on_the_device_matches_cpu():
    # bf16/fp16 binary kernels read a scalar operand's value in its own dtype
    # (original_scalar_value); a 0-dim float32 openreg tensor is such an operand.
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(16).to(dtype)
        s = torch.tensor(1 / 3)
        for fn in (torch.add, torch.mul, torch.div):
            assert_same(fn(x.to(DEV), s.to(DEV)), fn(x, s))


@pytest.mark.parametrize("name", ["add.out", "sub.out", "mul.out", "div.out", "eq.Tensor_out", "lt.Tensor_out"])
def test_binary_with_python_scalars(name):
    fn = BINARY[name]
    i = torch.arange(6).reshape(2, 3)
    assert_same(fn(i.to(DEV), 2.5), fn(i, 2.5))
    assert_same(fn(i.to(DEV), 2), fn(i, 2))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_cpu(name):
    fn = UNARY[name]
    for a in [positive(4, 7), positive(7, 4).t(), positive(3, 8)[:, 1::3], positive(()), positive(0, 3)]:
        assert_same(fn(a.to(DEV)), fn(a))


@pytest.mark.parametrize("name", ["neg.out", "exp.out", "sqrt.out", "sigmoid.out", "tanh.out"])
def test_unary_of_integers_promotes_like_cpu(name):
    fn = UNARY[name]
    i = torch.arange(1, 7, dtype=torch.int64)
    assert_same(fn(i.to(DEV)), fn(i))


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_match_cpu(name):
    fn = REDUCTIONS[name]
    for a in [torch.randn(4, 6), torch.randn(6, 4).t(), torch.randn(4, 0)]:
        if name == "max.dim_max" and a.numel() == 0:
            continue  # max over an empty dim raises on CPU too (tested below)
        assert_same(fn(a.to(DEV)), fn(a))


def test_max_dim_precomputed_dim_wraps_and_keepdim():
    a = torch.randn(3, 4, 5)
    for dim in (-1, 0, 2):
        for keepdim in (False, True):
            assert_same(torch.max(a.to(DEV), dim, keepdim), torch.max(a, dim, keepdim))


def test_max_of_empty_dim_raises_like_cpu():
    with pytest.raises(IndexError, match="Expected reduction dim 1 to have non-zero size"):
        torch.max(torch.randn(4, 0, device=DEV), dim=1)


# Reductions whose stub kernel gives CPU's kernel CPU aliases of the
# iterator's operands from GRAIN_SIZE elements, where CPU's parallel paths
# build iterators of their own from the tensors; below that CPU's kernel runs
# on the openreg tensors' kernel addresses.
FULL_REDUCTIONS = {
    "sum": torch.sum,
    "amax": torch.amax,
    "amin": torch.amin,
    "any": torch.any,
    "all": torch.all,
    "argmax": torch.argmax,
    "argmin": torch.argmin,
    "prod": lambda a, *dim: torch.prod(a, *dim) if dim else torch.prod(a, 0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool])
@pytest.mark.parametrize("name", sorted(FULL_REDUCTIONS))
def test_reductions_below_and_above_cpus_parallel_threshold_match_cpu(name, dtype):
    fn = FULL_REDUCTIONS[name]
    for shape in [(16,), (4, 4), (300, 200), (200, 300)]:  # 60000 >= GRAIN_SIZE (32768)
        a = (torch.randn(shape) * 8).to(dtype)
        for t in [a, a.t()]:
            for dims in [(), (0,), (-1,)]:
                try:
                    expected = fn(t, *dims)
                except RuntimeError as cpu_error:  # argmax of bool: not implemented on CPU
                    with pytest.raises(RuntimeError) as device_error:
                        fn(t.to(DEV), *dims)
                    assert str(device_error.value) == str(cpu_error)
                    continue
                got = fn(t.to(DEV), *dims)
                if dtype == torch.float32 and name == "sum":
                    assert got.device.type == DEV
                    assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-3)  # summation order
                else:
                    assert_same(got, expected)


@pytest.mark.parametrize("name", ["sum", "prod", "amax", "amin", "any", "all", "argmax", "argmin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_small_reductions_into_strided_outs_match_cpu(name, dtype):
    # Below GRAIN_SIZE the output stays an openreg tensor: CPU's kernel fills
    # it with the identity through openreg's fill_, then writes through the
    # iterator's pointers. A strided out= view must get CPU's values, and the
    # elements between its own must keep theirs.
    fn = getattr(torch, name)
    a = (torch.randn(5, 6) * 4).to(dtype)
    for t, dim in [(a, 0), (a.t(), 1), (a, 1)]:
        try:
            expected = fn(t, dim)
        except RuntimeError:  # argmax/argmin, prod of bool: as CPU (tested above)
            continue
        cpu_base = torch.full((expected.numel() * 3,), 5, dtype=expected.dtype)
        fn(t, dim, out=cpu_base[1::3])
        base = cpu_base.new_full(cpu_base.shape, 5).to(DEV)
        out = base[1::3]
        assert fn(t.to(DEV), dim, out=out) is out
        assert_same(base, cpu_base)


def test_a_reduction_leaves_its_operands_on_the_device():
    # The stub kernel exchanges the iterator's operands for CPU aliases while
    # CPU's kernel runs, and gives them back afterwards.
    a = torch.randn(300, 200, device=DEV)
    out = torch.empty(200, device=DEV)
    torch.sum(a, 0, out=out)
    assert out.device.type == DEV and a.device.type == DEV
    assert_close(out.cpu(), a.cpu().sum(0), rtol=1e-5, atol=1e-4)
    a.add_(1)  # both still usable as device tensors
    out.zero_()
    assert_close(torch.sum(a, 0, out=out).cpu(), a.cpu().sum(0), rtol=1e-5, atol=1e-4)


def test_sum_with_dtype_and_integer_input():
    i = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    assert_same(torch.sum(i.to(DEV), dim=0), torch.sum(i, dim=0))
    assert_same(torch.sum(i.to(DEV), dim=1, dtype=torch.float64), torch.sum(i, dim=1, dtype=torch.float64))


@pytest.mark.parametrize("name", ["add.out", "mul.out", "div.out", "pow.Tensor_Tensor_out"])
def test_inplace_writes_self_and_returns_it(name):
    method = {"add.out": "add_", "mul.out": "mul_", "div.out": "div_", "pow.Tensor_Tensor_out": "pow_"}[name]
    a, b = positive(3, 4), positive(4)
    da = a.to(DEV)
    ptr = da.data_ptr()
    out = getattr(da, method)(b.to(DEV))
    assert out is da and da.data_ptr() == ptr
    assert_close(da.cpu(), getattr(a.clone(), method)(b))


def test_inplace_into_a_lower_precision_self_casts_back_like_cpu():
    a, b = positive(3, 4), positive(4, dtype=torch.float64)
    da = a.to(DEV)
    da.mul_(b.to(DEV))
    assert da.dtype == torch.float32
    assert_close(da.cpu(), a.clone().mul_(b))


def test_inplace_into_integers_rejects_a_float_result_like_cpu():
    i = torch.arange(4)
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        i.to(DEV).mul_(torch.ones(4, device=DEV))
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        i.mul_(torch.ones(4))


def test_inplace_that_would_broadcast_self_raises_like_cpu():
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        torch.ones(4, device=DEV).add_(torch.ones(3, 4, device=DEV))


def test_inplace_on_non_contiguous_self():
    a, b = positive(4, 6), positive(3)
    da = a.to(DEV)
    da[:, ::2].mul_(b.to(DEV))
    a[:, ::2].mul_(b)
    assert_close(da.cpu(), a)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_out_of_the_right_shape_is_written_in_place(name):
    fn = BINARY[name]
    a, b = positive(3, 4), positive(4)
    expected = fn(a, b)
    out = torch.empty(3, 4, dtype=expected.dtype, device=DEV)
    ptr = out.data_ptr()
    result = fn(*on_device(a, b), out=out)
    assert result is out and out.data_ptr() == ptr
    assert_same(out, expected)


def test_out_is_resized_with_the_cpu_warning_when_it_has_elements():
    a, b = positive(3, 4), positive(4)
    empty = torch.empty(0, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.add(*on_device(a, b), out=empty)  # an empty out is resized silently
    assert_same(empty, a + b)
    wrong = torch.empty(5, device=DEV)
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.add(*on_device(a, b), out=wrong)
    assert_same(wrong, a + b)


def test_out_of_wrong_dtype_raises_like_cpu():
    a, b = positive(3), positive(3)
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        torch.mul(*on_device(a, b), out=torch.empty(3, dtype=torch.long, device=DEV))
    # A wider out dtype is allowed and computed in the common dtype.
    out = torch.empty(3, dtype=torch.float64, device=DEV)
    torch.mul(*on_device(a, b), out=out)
    assert_close(out.cpu(), torch.mul(a, b, out=torch.empty(3, dtype=torch.float64)))


def test_comparison_into_a_float_out():
    a, b = torch.randn(5), torch.randn(5)
    out = torch.empty(5, device=DEV)
    torch.lt(*on_device(a, b), out=out)
    assert_close(out.cpu(), torch.lt(a, b, out=torch.empty(5)))


def test_non_contiguous_out_is_written_through_a_proxy():
    a, b = positive(4, 3), positive(3)
    out = torch.zeros(3, 4, device=DEV).t()
    torch.mul(*on_device(a, b), out=out)
    assert out.stride() == (1, 4)
    assert_close(out.cpu(), a * b)


def test_out_on_another_device_raises():
    a = positive(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.neg(a.to(DEV), out=torch.empty(3))


def test_out_overlapping_an_input_raises_like_cpu():
    a = torch.arange(6.0)
    da = a.to(DEV)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.add(da[:4], 1, out=da[2:])
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.add(a[:4], 1, out=a[2:])


def test_out_as_its_own_input_is_fine():
    a = positive(5)
    da = a.to(DEV)
    torch.exp(da, out=da)
    assert_close(da.cpu(), a.exp())


def test_zero_size_inputs():
    a, b = torch.randn(0, 4), torch.randn(4)
    assert_same(torch.add(*on_device(a, b)), a + b)
    assert_same(torch.exp(a.to(DEV)), a.exp())


def test_mixed_devices_raise():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.add(torch.ones(3, device=DEV), torch.ones(3))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.add(torch.ones(3, device="openreg:0"), torch.ones(3, device="openreg:1"))


def test_outputs_are_allocated_on_the_inputs_device():
    a, b = positive(3), positive(3)
    with torch.openreg.device(0):
        r = torch.add(a.to("openreg:1"), b.to("openreg:1"))
        assert r.device == torch.device("openreg:1")
        assert torch.openreg.current_device() == 0
    assert_close(r.cpu(), a + b)


def test_fill_and_zero_reach_the_fill_stub():
    t = torch.empty(3, 4, dtype=torch.float64, device=DEV)
    t.fill_(2.5)
    assert_close(t.cpu(), torch.full((3, 4), 2.5, dtype=torch.float64))
    t[:, 1].zero_()
    expected = torch.full((3, 4), 2.5, dtype=torch.float64)
    expected[:, 1] = 0
    assert_close(t.cpu(), expected)
    assert torch.ones(4, dtype=torch.int16, device=DEV).cpu().tolist() == [1, 1, 1, 1]


def test_autograd_through_structured_ops():
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    da = a.to(DEV).requires_grad_()
    db = b.to(DEV).requires_grad_()
    (torch.tanh(da * db) - db).exp().sum().backward()
    ca, cb = a.clone().requires_grad_(), b.clone().requires_grad_()
    (torch.tanh(ca * cb) - cb).exp().sum().backward()
    assert_close(da.grad.cpu(), ca.grad)
    assert_close(db.grad.cpu(), cb.grad)


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.arange(16.0, device=d),  # small and dense: a memset
        lambda d: torch.arange(40000.0, device=d),  # large: fill_
        lambda d: torch.arange(24.0, device=d).reshape(4, 6).t(),  # dense, permuted
        lambda d: torch.arange(24.0, device=d)[::3],  # strided: fill_
        lambda d: torch.arange(6, device=d).to(torch.complex64),
        lambda d: torch.empty(0, 3, device=d),  # no memory at all: nothing to write
    ],
)
def test_zero_matches_cpu_and_writes_only_the_tensor(make):
    base_cpu, base_dev = torch.arange(50.0), torch.arange(50.0, device=DEV)
    expected, actual = make("cpu"), make(DEV)
    expected.zero_()
    assert actual.zero_() is actual
    assert_same(actual, expected)
    base_dev[::7].zero_()
    base_cpu[::7].zero_()
    assert_same(base_dev, base_cpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex64, torch.bfloat16])
def test_abs_kernel_matches_cpu(dtype):
    x = (torch.randn(5, 4) * 10).to(dtype)
    assert_same(torch.abs(x.to(DEV)), torch.abs(x))
    assert_same(torch.abs(x.to(DEV).t()), torch.abs(x.t()))
    out = torch.empty(0, dtype=torch.abs(x).dtype, device=DEV)
    assert torch.abs(x.to(DEV), out=out) is out
    assert_same(out, torch.abs(x))


def test_zero_of_a_tensor_on_another_device_than_the_current_one():
    # zero_'s wrapper sets no device: the memset and fill_ name the tensor's.
    with torch.openreg.device(0):
        for n in (16, 40000):
            t = torch.arange(float(n), device="openreg:1")
            assert t.zero_() is t
            assert t.device == torch.device("openreg:1")
            assert_same(t, torch.zeros(n))
            assert torch.openreg.current_device() == 0


# Structured groups declared `on_cpu_aliases: true`: CPU's impl() runs on CPU
# aliases of the device tensors. out= operator -> its positional arguments,
# built with `t(*shape)` (random tensors of the dtype under test, contiguous
# or not; t.dtype is that dtype); a last dict holds keyword arguments.
def _softmax_grad(t, log):
    x = t(4, 6).double()  # softmax's output, in the dtype under test
    output = (x.log_softmax(0) if log else x.softmax(-1)).to(t.dtype)
    return (t(4, 6), output, 0 if log else -1, t.dtype)


def _pool_grad(t):
    x = t(2, 3, 6, 8)
    return (t(2, 3, 3, 4), x, [2, 2], [2, 2], [0, 0], False, True, None)


def _max_pool_grad(t):
    x = t(2, 3, 6, 8)
    _, indices = torch.ops.aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
    return (t(2, 3, 3, 4), x, [2, 2], [2, 2], [0, 0], [1, 1], False, indices)


SCATTER_INDEX = torch.tensor([[0, 5, 5], [1, 1, 2], [4, 3, 0], [2, 2, 2]])
ON_ALIASES = {
    "_softmax.out": lambda t: (t(4, 6), -1, False),
    "_log_softmax.out": lambda t: (t(4, 6), 0, False),
    "_softmax_backward_data.out": lambda t: _softmax_grad(t, log=False),
    "_log_softmax_backward_data.out": lambda t: _softmax_grad(t, log=True),
    "cumsum.out": lambda t: (t(4, 6), 1),
    "cumprod.out": lambda t: (t(4, 6), 0),
    "norm.out": lambda t: (t(4, 6), 3, [1], False),
    "norm.dtype_out": lambda t: (t(4, 6), 2, [0], True, {"dtype": torch.float64}),
    "linalg_vector_norm.out": lambda t: (t(4, 6), 2.5, [1]),
    "avg_pool2d.out": lambda t: (t(2, 3, 6, 8), [3, 2], [2, 2], [1, 0]),
    "avg_pool2d_backward.grad_input": _pool_grad,
    "max_pool2d_with_indices.out": lambda t: (t(2, 3, 6, 8), [3, 2], [2, 2], [1, 0]),
    "max_pool2d_with_indices_backward.grad_input": _max_pool_grad,
    "gelu.out": lambda t: (t(4, 6),),
    "gelu_backward.grad_input": lambda t: (t(4, 6), t(4, 6)),
    "mean.out": lambda t: (t(4, 6), [1]),
    "min.dim_min": lambda t: (t(4, 6), 0),
    "addmv.out": lambda t: (t(4), t(4, 6), t(6)),
    "scatter_add.out": lambda t: (t(4, 6), 1, SCATTER_INDEX, t(4, 3)),
    "scatter.reduce_out": lambda t: (t(4, 6), 1, SCATTER_INDEX, t(4, 3), {"reduce": "multiply"}),
    "scatter_reduce.two_out": lambda t: (t(4, 6), 1, SCATTER_INDEX, t(4, 3), "amax"),
    "index_add.out": lambda t: (t(4, 6), 0, torch.tensor([3, 0, 3]), t(3, 6)),
    "index_copy.out": lambda t: (t(4, 6), 0, torch.tensor([3, 0]), t(2, 6)),
    "tril.out": lambda t: (t(4, 6), 1),
    "triu.out": lambda t: (t(4, 6), -1),
    "sort.values_stable": lambda t: (t(4, 6), {"stable": True, "dim": 0, "descending": True}),
    "topk.values": lambda t: (t(4, 6), 3, 1),
    "isin.Tensor_Tensor_out": lambda t: (t(4, 6).round(), t(7).round()),
    "isin.Tensor_Scalar_out": lambda t: (t(4, 6).round(), 0.0),
    "_linalg_solve_ex.result": lambda t: (t(4, 4), t(4, 2)),
}
ON_ALIASES_ENTRIES = {str(s.name): s for s in CONFIG.structured if s.route is Route.structured_on_cpu_aliases}


class Maker:
    """t(*shape): a random tensor of `dtype`, made non-contiguous (the
    transpose of a contiguous one) when `contiguous` is false."""

    def __init__(self, dtype, contiguous, seed=0):
        self.dtype, self.contiguous = dtype, contiguous
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, *shape):
        if self.contiguous or len(shape) < 2:
            return torch.randn(shape, generator=self.generator).to(self.dtype)
        flipped = (*shape[:-2], shape[-1], shape[-2])
        return torch.randn(flipped, generator=self.generator).to(self.dtype).transpose(-1, -2)


def aten(op_name):
    root, _, overload = op_name.partition(".")
    return getattr(getattr(torch.ops.aten, root), overload or "default")


def on_cpu_aliases_call(name, dtype, contiguous):
    """(functional overload, out= overload, CPU arguments, keyword arguments)."""
    g = ON_ALIASES_ENTRIES[name].group
    args = ON_ALIASES[name](Maker(dtype, contiguous))
    kwargs = args[-1] if isinstance(args[-1], dict) else {}
    return aten(str(g.functional.func.name)), aten(name), args[: len(args) - bool(kwargs)], kwargs


def to_dev(args):
    return [a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args]


def run_both(fn, args, **kwargs):
    """fn on CPU and on openreg: (expected, actual), or (None, None) after
    checking that both raised the same exception."""
    dev_kwargs = {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    try:
        expected = fn(*args, **kwargs)
    except Exception as cpu_error:  # what CPU raises, openreg must raise
        with pytest.raises(type(cpu_error)) as device_error:
            fn(*to_dev(args), **dev_kwargs)
        assert str(device_error.value) == str(cpu_error)
        return None, None
    return expected, fn(*to_dev(args), **dev_kwargs)


def test_every_on_cpu_aliases_group_is_tested_here():
    assert set(ON_ALIASES) == set(ON_ALIASES_ENTRIES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "non_contiguous"])
@pytest.mark.parametrize("name", sorted(ON_ALIASES))
def test_on_cpu_aliases_groups_match_cpu(name, contiguous, dtype):
    functional, _, args, kwargs = on_cpu_aliases_call(name, dtype, contiguous)
    expected, actual = run_both(functional, args, **kwargs)
    if expected is None:
        return  # CPU raised (integer softmax, ...), and openreg raised the same
    assert_same(actual, expected)


def on_cpu_aliases_out_call(name):
    """(out= overload, CPU arguments, keyword arguments, {out= argument name: CPU's result})."""
    functional, out_op, args, kwargs = on_cpu_aliases_call(name, torch.float32, contiguous=True)
    expected = functional(*args, **kwargs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    names = [a.name for a in out_op._schema.arguments if a.is_out]
    return out_op, args, kwargs, dict(zip(names, expected))


@pytest.mark.parametrize("name", sorted(ON_ALIASES))
def test_on_cpu_aliases_out_variants_resize_check_dtype_and_return_out(name):
    out_op, args, kwargs, expected = on_cpu_aliases_out_call(name)
    # Empty out= tensors are resized (no warning for 0 elements), then written.
    outs = {n: torch.empty(0, dtype=e.dtype, device=DEV) for n, e in expected.items()}
    returned = out_op(*to_dev(args), **kwargs, **outs)
    returned = returned if isinstance(returned, tuple) else (returned,)
    for r, (n, e) in zip(returned, expected.items()):
        assert r is outs[n]
        assert_same(r, e)
    # An out= of another dtype: CPU's error, or CPU's result (cumsum casts).
    for dtype in (torch.float64, torch.int32):
        other = {n: torch.zeros(e.shape, dtype=dtype) for n, e in expected.items()}
        cpu_result, dev_result = run_both(out_op, args, **kwargs, **other)
        if cpu_result is not None:
            assert_same(dev_result, cpu_result)


@pytest.mark.parametrize("name", sorted(ON_ALIASES))
def test_on_cpu_aliases_rejects_a_cpu_tensor_among_openreg_ones(name):
    out_op, args, kwargs, expected = on_cpu_aliases_out_call(name)
    outs = {n: torch.zeros_like(e) for n, e in expected.items()}  # on CPU
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        out_op(*to_dev(args), **kwargs, **outs)
    for o in outs.values():
        assert not o.any()  # nothing written


def test_on_cpu_aliases_out_that_is_the_input_matches_cpu():
    # Operands on one device storage share one host storage, so CPU's impl
    # sees the same tensors overlap as a CPU call.
    for name, op, args in [
        ("_softmax.out", torch.ops.aten._softmax.out, (-1, False)),
        ("cumsum.out", torch.ops.aten.cumsum.out, (1,)),
    ]:
        a = torch.randn(4, 6)
        d = a.to(DEV)
        expected = op(a, *args, out=a)
        assert op(d, *args, out=d) is d, name
        assert_same(d, expected)


@pytest.mark.parametrize(
    "method, args",
    [
        ("cumsum_", (1,)),
        ("cumprod_", (1,)),
        ("tril_", (1,)),
        ("scatter_add_", (1, SCATTER_INDEX, torch.ones(4, 3))),
        ("scatter_reduce_", (1, SCATTER_INDEX, torch.ones(4, 3), "sum")),
        ("index_add_", (0, torch.tensor([3, 0, 3]), torch.ones(3, 6))),
        ("index_copy_", (0, torch.tensor([3, 0]), torch.ones(2, 6))),
    ],
)
def test_on_cpu_aliases_in_place(method, args):
    a = torch.randn(4, 6)
    d = a.to(DEV)
    ptr = d.data_ptr()
    assert getattr(d, method)(*to_dev(args)) is d and d.data_ptr() == ptr
    assert_same(d, getattr(a, method)(*args))
    if method not in ("cumsum_", "cumprod_"):
        return
    with pytest.raises(RuntimeError) as cpu_error:
        getattr(torch.arange(6), method)(0, dtype=torch.float32)
    with pytest.raises(RuntimeError) as device_error:
        getattr(torch.arange(6, device=DEV), method)(0, dtype=torch.float32)
    assert str(device_error.value) == str(cpu_error.value)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.softmax(x, -1),
        lambda x: torch.log_softmax(x, 0),
        lambda x: torch.cumsum(x, 1),
        lambda x: torch.cumprod(x, 0),
        lambda x: torch.norm(x, 3, dim=1),
        lambda x: torch.linalg.vector_norm(x, 2.5),
        lambda x: torch.nn.functional.avg_pool2d(x.reshape(1, 2, 4, 3), 2, padding=1),
        lambda x: torch.nn.functional.max_pool2d(x.reshape(1, 2, 4, 3), 2, padding=1),
    ],
    ids=["softmax", "log_softmax", "cumsum", "cumprod", "norm", "vector_norm", "avg_pool2d", "max_pool2d"],
)
def test_on_cpu_aliases_autograd_matches_cpu(fn):
    x = torch.randn(4, 6, dtype=torch.float64)
    cx, dx = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    expected, actual = fn(cx), fn(dx)
    assert_same(actual.detach(), expected.detach())
    grad = torch.randn(expected.shape, dtype=torch.float64)
    expected.backward(grad)
    actual.backward(grad.to(DEV))
    assert_same(dx.grad, cx.grad)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_takes_cpus_path_and_gives_cpus_bits(approximate):
    # CPU's gelu impl uses oneDNN for contiguous float32 CPU tensors (CPU
    # aliases are CPU tensors) and ATen's kernel otherwise (on the iterator,
    # at kernel addresses): either way openreg's result is CPU's, bit for bit.
    views = [lambda t: t, lambda t: t.double(), lambda t: t[::2], lambda t: t.reshape(60, 50).t()]
    x = torch.randn(3000, generator=torch.Generator().manual_seed(0))
    g = torch.randn(3000, generator=torch.Generator().manual_seed(1))
    for view in views:  # taken on each device (.to() would make a strided view contiguous)
        a, b, da, db = view(x), view(g), view(x.to(DEV)), view(g.to(DEV))
        y = torch.nn.functional.gelu(a, approximate=approximate)
        assert torch.equal(torch.nn.functional.gelu(da, approximate=approximate).cpu(), y)
        grad = torch.ops.aten.gelu_backward(b, a, approximate=approximate)
        assert torch.equal(torch.ops.aten.gelu_backward(db, da, approximate=approximate).cpu(), grad)


def test_on_cpu_aliases_leaves_no_memory_behind():
    x = torch.randn(4, 6, device=DEV)

    def calls():
        y = torch.softmax(x, -1)
        torch._softmax_backward_data(y, y, -1, y.dtype)
        torch.cumsum(x, 0, out=torch.empty(0, device=DEV))

    calls()
    gc.collect()
    before = torch.openreg.memory_allocated()
    for _ in range(200):
        calls()
    gc.collect()
    assert torch.openreg.memory_allocated() == before
    x.add_(1)  # the operand is still a usable device tensor
    assert_close(torch.softmax(x, -1).cpu(), torch.softmax(x.cpu(), -1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_float_sum_over_two_strided_dims_takes_cpus_float_buffer(dtype):
    """CPU sums half/bfloat16 through a float buffer where the iterator keeps
    two reduced dimensions (ReduceOps.cpp: should_use_acc_buffer, which asks
    is_cpu()); openreg's sum impl does too, so strided sums keep CPU's bits."""
    base = torch.randn(100, generator=torch.Generator().manual_seed(3)).mul(8).to(dtype)
    for size, stride, offset, dims in (
        ((1, 3, 4), (20, 5, 1), 26, None),
        ((3, 4), (5, 1), 26, None),
        ((4, 5, 3), (1, 12, 4), 0, (0, 1)),
        ((4, 5, 3), (1, 12, 4), 0, (1, 2)),
    ):
        cpu = base.as_strided(size, stride, offset)
        dev = base.to(DEV).as_strided(size, stride, offset)
        expected = cpu.sum() if dims is None else cpu.sum(dims)
        got = dev.sum() if dims is None else dev.sum(dims)
        assert torch.equal(got.cpu(), expected), (size, stride, dims)
