"""PyTorch's OpInfo database on openreg beyond its sample inputs, against CPU.

tests/test_opinfo.py runs every sample of every OpInfo in one dtype. This file
runs, per OpInfo, what PyTorch's own device-generic tests add to that
(docs/conformance.md says what is sampled):

- ``error/<i>``: every ``error_inputs`` entry raises its declared exception
  type, matching its message, at the call (as ``TestCommon.test_errors``), in a
  fresh and in a warm call (the same call twice: the first of a kind may run at
  once, the second is queued), and leaves no error for the next synchronisation;
- ``dtype/<dtype>/<i>``: the first samples in every other dtype the OpInfo
  claims for CPU and openreg (complex, half, bfloat16, integers, bool);
- ``reference/<i>``: the first ``REFERENCE_SAMPLES`` of ``reference_inputs``
  beyond the sample inputs, for OpInfos that define them;
- ``deterministic/<i>``: the first samples under
  ``torch.use_deterministic_algorithms(True)``, compared with CPU in that mode;
- ``out_device/0``: an ``out=`` tensor on the CPU raises RuntimeError (as
  ``TestCommon.test_out``; factories without ``device=`` aside);
- ``out_dtype/0``: an ``out=`` tensor of a dtype the result cannot be cast to
  safely (long for a floating or complex result) raises what CPU raises.

Differences are listed in ``tests/opinfo_expected_failures.yaml`` with these
kinds, by the same rule as test_opinfo.py's: the list only shrinks.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import re
import warnings

import torch
from torch.testing._internal.common_device_type import OpDTypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_utils import DeterministicGuard, TestCase
from torch.utils._pytree import tree_flatten, tree_map

import conformance
import opinfo_report
from test_opinfo import BEYOND_SAMPLES_KINDS as KINDS
from test_opinfo import (
    EXPECTED_FAILURES, EXPECTED_FAILURES_FILE, NOT_COMPARABLE, OPS, call, cpu_sample, out_arguments,
    result_belongs_on_device,
)

MODES = ("queue_all",)  # the extra CI passes that run this file (tests/conftest.py)

DTYPE_SAMPLES = 2  # per extra dtype
REFERENCE_SAMPLES = 4
DETERMINISTIC_SAMPLES = 2


def expected_for(name: str) -> dict[str, str]:
    """The listed samples of `name` of this file's kinds; ``<kind>/*`` and
    ``dtype/<dtype>/*`` stand for every sample they prefix."""
    return {s: r for s, r in EXPECTED_FAILURES.get(name, {}).items() if s.split("/")[0] in KINDS}


def listed(sample_id: str, expected: dict[str, str]) -> str | None:
    for pattern in expected:
        if pattern == sample_id or (pattern.endswith("/*") and sample_id.startswith(pattern[:-1])):
            return pattern
    return None


def raised(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except Exception as e:  # noqa: BLE001 (the exception is what is compared)
        return e
    return None


def pending_error(device) -> Exception | None:
    """The error a kernel left for the next synchronisation, if any."""
    return raised(lambda: torch.openreg.synchronize(device))


class TestOpInfoBeyondSamples(conformance.CpuOracle, TestCase):
    def check_error_inputs(self, op, device, failures, count):
        """Each error input raises CPU's exception type at the call, in a
        fresh and in a warm call. Error inputs built for the CPU are the oracle
        where both devices build as many; the ErrorInput's own type and message
        (which may differ for non-CPU devices, as narrow_copy's) also pass."""
        on_device = list(op.error_inputs(device))
        on_cpu = list(op.error_inputs("cpu"))
        for index, error_input in enumerate(on_device):
            count("error")
            sample = error_input.sample_input
            if len(on_cpu) == len(on_device):
                host = on_cpu[index].sample_input
                expected = raised(lambda: op(host.input, *host.args, **host.kwargs))
            else:
                expected = error_input.error_type(error_input.error_regex)
            problem = None
            for when in ("fresh", "warm"):
                e = raised(lambda: op(sample.input, *sample.args, **sample.kwargs))
                later = pending_error(device)
                if later is not None:
                    problem = f"{when} call: raised at the next synchronisation, not at the call: {str(later)[:200]}"
                elif expected is None and e is not None:
                    problem = f"{when} call: CPU raised nothing, openreg raised {type(e).__name__}: {str(e)[:200]}"
                elif expected is not None and e is None:
                    problem = f"{when} call: no error; CPU raised {type(expected).__name__}: {str(expected)[:200]}"
                elif (
                    expected is not None
                    and not isinstance(e, type(expected))
                    and not (isinstance(e, error_input.error_type) and re.search(error_input.error_regex, str(e)))
                ):
                    problem = f"{when} call: raised {type(e).__name__}: {str(e)[:200]}; CPU raised {type(expected).__name__}"
                if problem:
                    failures[f"error/{index}"] = problem
                    break

    def compare_samples(self, op, kind, samples, values, failures, count, guard=None):
        for index, sample in samples:
            count(kind.split("/")[0])
            host = cpu_sample(sample)
            with guard() if guard else contextlib.nullcontext():
                expected, expected_error = call(op, host)
                actual, actual_error = call(op, sample)
                later = pending_error(sample_device(sample))
            check_device = result_belongs_on_device(sample, self.device_type)
            problem = self.compare(expected, expected_error, actual, actual_error, check_device, values)
            if problem is None and later is not None and expected_error is None:
                problem = f"a kernel failed: {str(later)[:200]}"
            if problem is not None:
                failures[f"{kind}/{index}"] = problem

    def check_out(self, op, device, sample, failures, count):
        result, error = call(op, sample, raw=True)
        if error is not None or out_arguments(result, "cpu") is None:
            return  # nothing to write into
        count("out_device")
        out = tree_map(lambda t: torch.empty_like(t, device="cpu"), result)
        e = raised(lambda: op(sample.input, *sample.args, **sample.kwargs, out=out))
        factory = op.is_factory_function and sample.kwargs.get("device") is None
        if not factory and not isinstance(e, RuntimeError):
            failures["out_device/0"] = f"an out= on the CPU: {'accepted' if e is None else repr(e)[:200]}"
        floating = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)
        if any(t.dtype in floating for t in tree_flatten(result)[0]):
            count("out_dtype")
            host = cpu_sample(sample)
            cpu_out = tree_map(lambda t: torch.empty(t.shape, dtype=torch.long), result)
            expected = raised(lambda: op(host.input, *host.args, **host.kwargs, out=cpu_out))
            device_out = tree_map(lambda t: torch.empty(t.shape, dtype=torch.long, device=device), result)
            actual = raised(lambda: op(sample.input, *sample.args, **sample.kwargs, out=device_out))
            actual = actual or pending_error(device)
            problem = self.compare(
                None if expected else cpu_out, expected, None if actual else device_out, actual, values=False
            )
            if problem is not None:
                failures["out_dtype/0"] = problem

    @ops(OPS, dtypes=OpDTypes.any_one)
    def test_conforms_beyond_samples(self, device, dtype, op):
        name = op.full_name
        values = name not in NOT_COMPARABLE
        failures: dict[str, str] = {}
        runs: dict[str, int] = {}

        def count(kind):
            runs[kind] = runs.get(kind, 0) + 1

        torch.openreg.synchronize()
        if op.error_inputs_func is not None:
            self.check_error_inputs(op, device, failures, count)
        # Samples are built lazily and only as many as run: building every
        # sample of every dtype costs more than running the few that run.
        claimed = op.supported_dtypes("cpu") & op.supported_dtypes(device)
        for other in sorted(claimed - {dtype}, key=str):
            samples = itertools.islice(op.sample_inputs(device, other), DTYPE_SAMPLES)
            self.compare_samples(op, f"dtype/{str(other).removeprefix('torch.')}", enumerate(samples), values, failures, count)
        plain = list(op.sample_inputs(device, dtype))
        if op.reference_inputs_func is not None:
            extra = itertools.islice(op.reference_inputs(device, dtype), len(plain), len(plain) + REFERENCE_SAMPLES)
            self.compare_samples(op, "reference", enumerate(extra), values, failures, count)
        guard = lambda: DeterministicGuard(True)  # noqa: E731
        self.compare_samples(op, "deterministic", enumerate(plain[:DETERMINISTIC_SAMPLES]), values, failures, count, guard)
        if op.supports_out and plain:
            self.check_out(op, device, plain[0], failures, count)
        self.assertIsNone(pending_error(device))

        expected = expected_for(name)
        opinfo_report.record_beyond(
            name, samples=runs, failed=collections.Counter(s.split("/")[0] for s in failures)
        )
        new = {s: p for s, p in failures.items() if listed(s, expected) is None}
        fixed = sorted(p for p in expected if not any(listed(s, {p: ""}) for s in failures))
        message = []
        if new:
            message.append(f"{len(new)} run(s) of {name} differ from CPU ({sum(runs.values())} runs: {runs}):")
            message += [f"  {s}: {p}" for s, p in list(new.items())[:12]]
        if fixed:
            message.append(f"listed in {EXPECTED_FAILURES_FILE} but now match CPU; remove them: {fixed}")
        if message:
            self.fail("\n".join(message))


def sample_device(sample):
    for leaf in tree_flatten((sample.input, sample.args, sample.kwargs))[0]:
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "openreg":
            return leaf.device
    return None


instantiate_device_type_tests(TestOpInfoBeyondSamples, globals(), only_for="openreg")
