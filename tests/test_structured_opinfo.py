"""Every structured group in backend_functions.yaml against CPU, over the sample
inputs of PyTorch's own OpInfo database: the functional, in-place and out=
variants, in several dtypes. Where CPU raises, openreg must raise the same
exception type."""

import os

import pytest
import torch
from torch.jit._builtins import _find_builtin
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

# OpInfos whose function torch's metadata does not tie to the aten operator it
# calls: Tensor.__getitem__ (x[tensor] is aten::index) and
# nn.functional.threshold (a Python function named _threshold).
UNNAMED_OPERATORS = {"__getitem__": {"index"}, "nn.functional.threshold": {"threshold"}}


def aten_names(op) -> set[str]:
    """The aten operators an OpInfo is about, from torch's metadata rather than
    from its name: its aten_name ("linalg.cross" has "linalg_cross"), the
    operators torch binds its function and its aliases' functions to (torch.jit's
    table of builtins: torch.special.airy_ai is aten::special_airy_ai), and its
    function's own name (nn.functional.silu and masked.sum are Python functions
    named after the operator they call)."""
    names = {op.aten_name, getattr(op.op, "__name__", ""), *UNNAMED_OPERATORS.get(op.name, ())}
    for fn in (op.op, *(alias.op for alias in op.aliases)):
        builtin = _find_builtin(fn)
        if builtin is not None and builtin.startswith("aten::"):
            names.add(builtin.removeprefix("aten::"))
    return names


def opinfos_for(roots: set[str]) -> list:
    """The OpInfos about the structured groups named `roots` (root names:
    "linalg_cross" for linalg_cross.out). Sparse OpInfos (sparse.mm for mm)
    build sparse inputs, which reach the sparse CPU fallback rather than a
    structured kernel; tests/test_opinfo.py compares them."""
    return sorted(
        (op for op in op_db if aten_names(op) & roots and not op.name.startswith("sparse.")),
        key=lambda op: (op.name, op.variant_test_name),
    )


OPINFOS = opinfos_for({s.group.root_name for s in CONFIG.structured})


def table_tested() -> set[str]:
    """The structured out= operators tests/test_structured.py's tables test."""
    from test_structured import BACKWARD, BINARY, ON_ALIASES, REDUCTIONS, UNARY

    return {*BINARY, *UNARY, *REDUCTIONS, *BACKWARD, *ON_ALIASES}


def untested(entries) -> list:
    """The structured entries with neither OpInfo samples nor a table test."""
    covered = {root for op in opinfos_for({s.group.root_name for s in entries}) for root in aten_names(op)}
    tables = {name.split(".")[0] for name in table_tested()}
    return [s for s in entries if s.group.root_name not in covered | tables]


def untested_message(entries) -> str:
    ops = ", ".join(f"{s.name} (line {s.loc.line})" for s in entries)
    return (
        f"structured groups of {os.path.basename(CONFIG.source)} that no test compares with CPU: {ops}. No OpInfo "
        "of torch's op_db is about their operators (by aten_name, the aten operator its function or an alias is "
        "bound to, or its function's name): add each to a table of tests/test_structured.py (BINARY, UNARY, "
        "REDUCTIONS, BACKWARD or ON_ALIASES), or, if an OpInfo calls it under another name, map that OpInfo's "
        "name to the operator in UNNAMED_OPERATORS (tests/test_structured_opinfo.py)"
    )


def test_every_structured_group_has_opinfo_samples_or_a_table_test():
    missing = untested(CONFIG.structured)
    assert not missing, untested_message(missing)


def test_opinfos_are_found_by_the_aten_operator_they_are_about():
    def names(root):
        return {op.name for op in opinfos_for({root})}

    assert "linalg.cross" in names("linalg_cross") and "linalg.cross" not in names("cross")
    assert "linalg.vector_norm" in names("linalg_vector_norm")
    assert "linalg.norm" not in names("norm")  # aten::linalg_norm, which calls linalg_vector_norm
    assert "special.airy_ai" in names("special_airy_ai")
    assert {"nn.functional.silu", "nn.functional.threshold"} <= names("silu") | names("threshold")
    assert "__getitem__" in names("index")
    assert "max" in names("maximum")  # its binary variant, whose alias is torch.maximum


def test_a_group_no_test_covers_is_named_with_its_line_and_what_to_do(tmp_path):
    path = tmp_path / "backend_functions.yaml"
    path.write_text(
        "cpp_namespace: n\nstubs:\n  kernels:\n    - {stub: cross_stub, kernel: cross_kernel}\nstructured:\n"
        "  - op: linalg_cross.out\n  - op: _convert_indices_from_coo_to_csr.out\n"
    )
    missing = untested(load(str(path)).structured)
    assert [str(s.name) for s in missing] == ["_convert_indices_from_coo_to_csr.out"]
    message = untested_message(missing)
    assert "_convert_indices_from_coo_to_csr.out (line 7)" in message
    assert "add each to a table of tests/test_structured.py" in message


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
