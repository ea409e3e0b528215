"""Every structured group in backend_functions.yaml against CPU, over the sample
inputs of PyTorch's own OpInfo database: the functional, in-place and out=
variants, in several dtypes. Where CPU raises, openreg must raise the same
exception type."""

import os

import pytest
import torch
from torch.testing import assert_close
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_map

import conformance  # noqa: F401  (op.sample_inputs without inspect.stack: see conformance.py)
from codegen.load import load

MODES = ("queue_all",)  # the extra CI passes that run this file (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV = "openreg"
DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16, torch.complex64)
SAMPLES_PER_DTYPE = 6

CONFIG = load(os.path.join(ROOT, "backend_functions.yaml"))
STRUCTURED_ROOTS = {s.group.root_name for s in CONFIG.structured}


def root_of(opinfo_name: str) -> str:
    """The native root name an OpInfo exercises: "special.i0e" -> "special_i0e",
    "nn.functional.silu" -> "silu"."""
    if opinfo_name == "__getitem__":
        return "index"  # x[tensor] is aten::index
    if opinfo_name.startswith("special."):
        return opinfo_name.replace(".", "_")
    return opinfo_name.split(".")[-1]


# Sparse OpInfos (sparse.mm for mm) build sparse inputs, which reach the sparse
# CPU fallback rather than a structured kernel; tests/test_opinfo.py compares them.
OPINFOS = sorted(
    (op for op in op_db if root_of(op.name) in STRUCTURED_ROOTS and not op.name.startswith("sparse.")),
    key=lambda op: (op.name, op.variant_test_name),
)


def test_every_structured_group_has_opinfo_samples_or_a_table_test():
    from tests.test_structured import BACKWARD, BINARY, ON_ALIASES, REDUCTIONS, UNARY

    covered = {root_of(op.name) for op in OPINFOS}
    covered |= {name.split(".")[0] for name in (*BINARY, *UNARY, *REDUCTIONS, *BACKWARD, *ON_ALIASES)}
    assert STRUCTURED_ROOTS - covered == set()


def to_device(x):
    """`x`'s tensors on the device with their strides: .to() would make a
    non-contiguous sample contiguous there, and CPU kernels that refuse
    non-contiguous input (native_group_norm) would see another tensor."""

    def one(v):
        if not isinstance(v, torch.Tensor) or v.layout != torch.strided or v.is_conj() or v.is_neg():
            return v.to(DEV) if isinstance(v, torch.Tensor) else v
        moved = torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=DEV).copy_(v)
        return moved.requires_grad_(v.requires_grad) if v.is_leaf else moved

    return tree_map(one, x)


def to_cpu(x):
    def one(v):
        if not isinstance(v, torch.Tensor):
            return v
        assert v.device.type == DEV, f"result on {v.device}"
        return v.cpu()

    return tree_map(one, x)


def run(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # compared with what the other device raises
        return None, e


def check_same(fn, sample, clone_input=False):
    cpu_input = sample.input.clone() if clone_input else sample.input
    dev_input = to_device(sample.input)
    expected, cpu_error = run(fn, cpu_input, *sample.args, **sample.kwargs)
    actual, dev_error = run(fn, dev_input, *to_device(sample.args), **to_device(sample.kwargs))
    if cpu_error is not None:
        assert dev_error is not None, f"CPU raised {cpu_error!r}, openreg did not"
        assert isinstance(dev_error, type(cpu_error)), f"CPU: {cpu_error!r}\nopenreg: {dev_error!r}"
        return
    assert dev_error is None, f"openreg raised {dev_error!r}, CPU did not"
    assert_close(to_cpu(actual), expected, equal_nan=True)  # also checks dtype and device
    if clone_input:
        assert_close(dev_input.cpu(), cpu_input, equal_nan=True)


def opinfo_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@pytest.mark.parametrize("op", OPINFOS, ids=opinfo_id)
def test_opinfo_samples_match_cpu(op):
    supported = op.supported_dtypes("cpu")
    ran = 0
    for dtype in (d for d in DTYPES if d in supported):
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:SAMPLES_PER_DTYPE]
        for sample in samples:
            check_same(op.op, sample)
            if op.inplace_variant is not None and isinstance(sample.input, torch.Tensor):
                check_same(op.inplace_variant, sample, clone_input=True)
            ran += 1
    assert ran > 0


@pytest.mark.parametrize("op", [op for op in OPINFOS if op.supports_out], ids=opinfo_id)
def test_opinfo_out_variant_matches_cpu(op):
    """out= starts empty on the device and must be resized to CPU's result."""
    checked = 0
    dtype = next(d for d in DTYPES if d in op.supported_dtypes("cpu"))
    for sample in list(op.sample_inputs("cpu", dtype, requires_grad=False))[:SAMPLES_PER_DTYPE]:
        expected, cpu_error = run(op.op, sample.input, *sample.args, **sample.kwargs)
        if cpu_error is not None:
            continue
        results = expected if isinstance(expected, tuple) else (expected,)
        outs = tuple(torch.empty(0, dtype=r.dtype, device=DEV) for r in results)
        out = outs if isinstance(expected, tuple) else outs[0]
        result = op.op(to_device(sample.input), *to_device(sample.args), **to_device(sample.kwargs), out=out)
        assert result is out or all(a is b for a, b in zip(result, outs))
        for o, r in zip(outs, results):
            assert_close(o.cpu(), r, equal_nan=True)
        checked += 1
    assert checked > 0
