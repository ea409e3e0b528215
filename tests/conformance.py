"""What tests/test_opinfo.py and tests/test_modules.py share: comparing an
openreg outcome with CPU's, and the lists of samples expected to differ.

A list is a yaml file (``tests/opinfo_expected_failures.yaml``,
``tests/modules_expected_failures.yaml``)::

    failures:
      <OpInfo or ModuleInfo name>:
        - reason: "why these samples differ"
          samples: [<kind>/<index>, ...]

``<kind>/*`` stands for every sample of that kind. A test fails when a sample
fails that is not listed, and also when a listed sample passes, so a list only
shrinks.
"""

from __future__ import annotations

import os
import random
import sys
import unittest

import numpy as np
import torch
import yaml
from torch.testing._internal import common_utils
from torch.testing._internal.opinfo import core as opinfo_core
from torch.utils._pytree import tree_flatten, tree_map


def load_expected_failures(path: str, kinds, whole: tuple[str, ...] = ()) -> tuple[dict[str, dict[str, str]], dict]:
    """({name: {sample id: reason}}, the file's ``not_comparable`` mapping).
    A sample id is ``<kind>/<index>`` with kind in `kinds`, or one of `whole`
    (ids that stand for every sample of the entry)."""
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    failures: dict[str, dict[str, str]] = {}
    for name, groups in (data.get("failures") or {}).items():
        for group in groups:
            for sample_id in group["samples"]:
                kind = sample_id.split("/")[0]
                assert kind in kinds or sample_id in whole, f"{path}: {name}: unknown sample kind in {sample_id!r}"
                failures.setdefault(name, {})[sample_id] = group["reason"]
    return failures, dict(data.get("not_comparable") or {})


def expand(expected: dict[str, str], runs: dict[str, int]) -> dict[str, str]:
    """`expected` ({id: reason}) with each ``<kind>/*`` replaced by the ids of
    the `runs[kind]` samples of that kind."""
    ids = {}
    for sample_id, reason in expected.items():
        kind, _, index = sample_id.partition("/")
        if index == "*":
            ids.update({f"{kind}/{i}": reason for i in range(runs.get(kind, 0))})
        else:
            ids[sample_id] = reason
    return ids


def unexpected(name: str, failures: dict[str, str], expected: dict[str, str], path: str, qualifier: str = "") -> str | None:
    """The failure message of a test whose failing samples `failures` ({id:
    problem}) are not those listed in `path` (`expected`, {id: reason}), or
    None if they are. `qualifier` follows the name in the message (" (float32)")."""
    new = {s: failures[s] for s in failures if s not in expected}
    fixed = sorted(s for s in expected if s not in failures)
    message = []
    if new:
        message.append(f"{len(new)} sample(s) of {name}{qualifier} differ from CPU:")
        message += [f"  {s}: {p}" for s, p in list(new.items())[:10]]
    if fixed:
        message.append(
            f"{len(fixed)} sample(s) of {name} listed in {os.path.basename(path)} "
            f"now match CPU; remove them from the list: {fixed}"
        )
    return "\n".join(message) if message else None


def on_cpu(value):
    return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, value)


def metadata(value):
    """What can be compared of results whose values are unspecified (torch.empty)."""
    return tree_map(lambda t: (t.shape, t.stride(), t.dtype) if isinstance(t, torch.Tensor) else t, value)


class CpuOracle:
    """Mixed into a device-generic TestCase: compares an outcome on the
    device under test with CPU's, by TestCase.assertEqual's rules (per-dtype
    tolerances, raised by the test's own precision / rel_tol)."""

    def compare(self, expected, expected_error, actual, actual_error, check_device=True, values=True):
        """None if openreg behaved like CPU, otherwise what differed."""
        if expected_error is not None:
            if actual_error is None:
                return f"CPU raised {type(expected_error).__name__}, openreg returned a result"
            # An error CPU's kernel raises from the data (an index out of range)
            # comes, as on CUDA, from the kernel: at the next synchronising
            # call, as an AcceleratorError carrying CPU's message.
            from_kernel = isinstance(actual_error, torch.AcceleratorError) and str(expected_error).splitlines()[0] in str(
                actual_error
            )
            if not isinstance(actual_error, type(expected_error)) and not from_kernel:
                return (
                    f"CPU raised {type(expected_error).__name__}, openreg raised "
                    f"{type(actual_error).__name__}: {actual_error}"
                )
            return None
        if actual_error is not None:
            return f"openreg raised {type(actual_error).__name__}: {str(actual_error)[:300]}"
        if check_device:
            for leaf in tree_flatten(actual)[0]:
                if isinstance(leaf, torch.Tensor) and leaf.device.type != self.device_type:
                    return f"a result is on {leaf.device}, not on {self.device_type}"
        if not values:
            actual, expected = metadata(actual), metadata(expected)
        try:
            self.assertEqual(on_cpu(actual), expected, exact_device=False)
        except AssertionError as e:
            # assert_equal names the differing item of a nested result last.
            body, _, item = str(e).rpartition("\n\nThe failure occurred for item ")
            if body:
                return f"values differ at {item.strip()}: {body[:300]}"
            return f"values differ: {str(e)[:300]}"
        return None


def reseed(value: int) -> None:
    """What torch.manual_seed does for the CPU and openreg generators, without
    its deferred seeding of the uninitialised CUDA, XPU and MTIA generators:
    torch.cuda._lazy_call (and XPU's, MTIA's) formats the whole Python stack
    on every call (2 ms under pytest), too slow to do before every sample."""
    torch.default_generator.manual_seed(value)
    torch.openreg.manual_seed_all(value)


# The iterator behind every op.sample_inputs() and module_inputs_func()
# (common_utils.TrackedInputIter) looks up the running test with
# inspect.stack(), which reads the source of every frame (50 ms under pytest),
# and seeds with torch.manual_seed before each sample (2 ms, above). Together
# they were half of the OpInfo tests' time. The two replacements compute the
# same thing: the test method of the TestCase on the stack (found by walking
# the frames, no source read), and the same seed on the generators this
# machine has, Python's and NumPy's.
def _running_test_fn():
    frame = sys._getframe(1)
    while frame is not None:
        self_val = frame.f_locals.get("self")
        if isinstance(self_val, unittest.TestCase):
            *_, cls_name, test_name = self_val.id().rsplit(".", 2)
            if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                return getattr(self_val, test_name).__func__
        frame = frame.f_back
    return None


def _set_rng_seed(seed=None) -> None:
    seed = common_utils.SEED if seed is None else seed
    reseed(seed)
    random.seed(seed)
    np.random.seed(seed)


common_utils.extract_test_fn = _running_test_fn
common_utils.set_rng_seed = _set_rng_seed
# OpInfo.sample_inputs looks the test up once more, through the name
# opinfo/core.py imported (its per-sample skips and xfails).
opinfo_core.extract_test_fn = _running_test_fn
