"""PyTorch's OpInfo database on openreg: every sample input of every operator,
run on CPU and on openreg, must give the same result.

One test per OpInfo (torch's device-generic test machinery instantiates it for
openreg through PrivateUse1TestBase), in one dtype per operator
(OpDTypes.any_one: float32 where the operator supports it). Each sample runs
three ways:

- ``contiguous``: the sample as OpInfo builds it;
- ``noncontiguous``: ``SampleInput.noncontiguous()``, the same values in
  non-contiguous tensors;
- ``out``: for operators with out=, the result written into openreg tensors
  passed as ``out=`` (compared with CPU writing into CPU tensors).

Results are compared with ``TestCase.assertEqual`` (OpInfo's tolerance rules:
per-dtype defaults, tightened or loosened by the OpInfo's own
``toleranceOverride`` decorators). Where CPU raises, openreg must raise the
same exception type. Random operators run with the same seed on both devices.
As in torch's own ``TestCommon.test_compare_cpu``, samples are built on the
device and copied to the CPU; the copy keeps the storage layout, so operators
whose result depends on it (``as_strided``) see the same memory. Operators whose
values are unspecified (``torch.empty``) are compared by shape, strides and
dtype.

Samples that do not match are listed, each with its reason, in
``tests/opinfo_expected_failures.yaml``; a test fails when a sample fails that
is not listed, and also when a listed sample passes (so the list only shrinks:
delete the entry). ``OPENREG_OPINFO_ONLY=add,mul`` limits the run to some
operators. The summary at the end of the pytest output gives the figures.
"""

from __future__ import annotations

import os
import time
import warnings

import torch
from torch.testing._internal.common_device_type import OpDTypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase
from torch.utils._pytree import tree_flatten

import conformance
import opinfo_report

MODES = ("queue_all", "discrete")  # the extra CI passes that run this file (tests/conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED_FAILURES_FILE = os.path.join(HERE, "opinfo_expected_failures.yaml")
SEED = 1234
KINDS = ("contiguous", "noncontiguous", "out")
# The kinds of tests/test_opinfo_beyond_samples.py, listed in the same file.
BEYOND_SAMPLES_KINDS = ("error", "dtype", "reference", "deterministic", "out_device", "out_dtype")
# The sample id of an operator whose samples cannot even be built on the device.
NO_SAMPLES = "samples"


EXPECTED_FAILURES, NOT_COMPARABLE = conformance.load_expected_failures(
    EXPECTED_FAILURES_FILE, KINDS + BEYOND_SAMPLES_KINDS, (NO_SAMPLES,)
)

_only = os.environ.get("OPENREG_OPINFO_ONLY")
OPS = [op for op in op_db if not _only or op.full_name in _only.split(",")]

_unknown = (set(EXPECTED_FAILURES) | set(NOT_COMPARABLE)) - {op.full_name for op in op_db}
assert not _unknown, f"{EXPECTED_FAILURES_FILE} names operators OpInfo does not have: {sorted(_unknown)}"


def cpu_copy(t):
    """`t` on the CPU with the same storage layout (size, strides, offset and
    the whole storage), so that layout-dependent operators (as_strided, views
    of a larger base) see the same memory on both devices."""
    if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
        return t
    if t.is_conj() or t.is_neg() or t.layout != torch.strided:
        return t.cpu()
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage().cpu(), t.storage_offset(), t.size(), t.stride())


def cpu_sample(sample):
    moved = sample.transform(cpu_copy)
    # Factory functions (torch.zeros, torch.arange, ...) name the device.
    if "device" in moved.kwargs:
        moved.kwargs = {**moved.kwargs, "device": "cpu"}
    return moved


def has_compressed_sparse(sample) -> bool:
    """Whether the sample holds a CSR, CSC, BSR or BSC tensor, which torch's
    noncontiguous_like cannot make non-contiguous (is_contiguous raises)."""
    compressed = {torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc}
    leaves = tree_flatten((sample.input, sample.args, sample.kwargs))[0]
    return any(isinstance(leaf, torch.Tensor) and leaf.layout in compressed for leaf in leaves)


def result_belongs_on_device(sample, device_type) -> bool:
    """Whether the result must be on the device: the sample has a tensor there
    and does not ask for another device (Tensor.to("cpu"), ...). torch.arange(3)
    without device= rightly returns a CPU tensor."""
    leaves = tree_flatten((sample.input, sample.args, sample.kwargs))[0]
    on_device = False
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.device.type == device_type:
            on_device = True
        elif isinstance(leaf, (str, torch.device)):
            try:
                device = torch.device(leaf)
            except RuntimeError:
                continue
            if device.type != device_type:
                return False
            on_device = True
    return on_device


def call(op, sample, raw=False, **extra):
    """Runs the sample with the RNG seeded the same way on every device; returns
    (result, None) or (None, exception)."""
    conformance.reseed(SEED)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = op(sample.input, *sample.args, **sample.kwargs, **extra)
        return (result if raw else sample.output_process_fn_grad(result)), None
    except Exception as e:  # noqa: BLE001 (the exception type is what is compared)
        return None, e


def out_arguments(result, device):
    """Tensors shaped like `result` (a tensor or a tuple of tensors) to pass as
    out=, or None when the result has another structure. They are filled with
    the same value on every device (NaN, or the dtype's largest value), so that
    elements a kernel leaves unwritten compare equal only if both left them."""
    if isinstance(result, torch.Tensor):
        return filled_like(result, device)
    if isinstance(result, (tuple, list)) and result and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(filled_like(t, device) for t in result)
    return None


def filled_like(t, device):
    if t.dtype.is_floating_point or t.dtype.is_complex:
        value = float("nan")
    elif t.dtype == torch.bool:
        value = True
    else:
        value = torch.iinfo(t.dtype).max
    return torch.full_like(t, value, device=device)


class TestOpInfoOnDevice(conformance.CpuOracle, TestCase):
    """The OpInfo samples on the device, compared with CPU."""

    def run_sample(self, op, device, kind, sample, values) -> str | None:
        if kind == "noncontiguous":
            sample = sample.noncontiguous()
        host = cpu_sample(sample)
        if kind != "out":
            expected, expected_error = call(op, host)
            actual, actual_error = call(op, sample)
            check_device = result_belongs_on_device(sample, self.device_type)
            return self.compare(expected, expected_error, actual, actual_error, check_device, values)
        # out=: the raw result (before output_process_fn_grad) gives the
        # structure; CPU writing into CPU tensors is the oracle.
        raw, error = call(op, host, raw=True)
        out = None if error is not None else out_arguments(raw, "cpu")
        if out is None:
            return None  # nothing to write into
        _, expected_error = call(op, host, raw=True, out=out)
        device_out = out_arguments(raw, device)
        returned, actual_error = call(op, sample, raw=True, out=device_out)
        if actual_error is None:
            for r, o in zip(tree_flatten(returned)[0], tree_flatten(device_out)[0]):
                if isinstance(r, torch.Tensor) and (
                    r is not o if r.layout != torch.strided else r.data_ptr() != o.data_ptr()  # sparse: no data_ptr
                ):
                    return "out= returned a tensor other than the out= argument"
        return self.compare(
            None if expected_error else out, expected_error,
            None if actual_error else device_out, actual_error,
            values=values,
        )

    @ops(OPS, dtypes=OpDTypes.any_one)
    def test_matches_cpu(self, device, dtype, op):
        name = op.full_name
        values = name not in NOT_COMPARABLE
        started = time.perf_counter()
        failures: dict[str, str] = {}
        runs = 0
        try:
            samples = list(op.sample_inputs(device, dtype))
        except Exception as e:  # noqa: BLE001
            # Every sample fails; count them as CPU builds them.
            samples = []
            runs = len(list(op.sample_inputs("cpu", dtype))) * (len(KINDS) if op.supports_out else len(KINDS) - 1)
            failures[NO_SAMPLES] = f"building the samples on {device} raised {type(e).__name__}: {str(e)[:300]}"
        for kind in KINDS:
            if kind == "out" and not op.supports_out:
                continue
            for index, sample in enumerate(samples):
                if kind == "noncontiguous" and has_compressed_sparse(sample):
                    continue  # SampleInput.noncontiguous() raises for CSR/BSR... inputs on every device
                runs += 1
                problem = self.run_sample(op, device, kind, sample, values)
                if problem is not None:
                    failures[f"{kind}/{index}"] = problem
        expected = {s: r for s, r in EXPECTED_FAILURES.get(name, {}).items() if s.split("/")[0] not in BEYOND_SAMPLES_KINDS}
        opinfo_report.record(
            name,
            samples=runs,
            values_compared=values,
            failed=runs if NO_SAMPLES in failures else len(failures),
            reasons=(
                [expected[NO_SAMPLES]] * runs
                if NO_SAMPLES in failures and NO_SAMPLES in expected
                else [expected[s] for s in failures if s in expected]
            ),
            seconds=time.perf_counter() - started,
            problems=failures,
        )
        message = conformance.unexpected(name, failures, expected, EXPECTED_FAILURES_FILE, f" ({dtype})")
        if message:
            self.fail(message)


instantiate_device_type_tests(TestOpInfoOnDevice, globals(), only_for="openreg")
