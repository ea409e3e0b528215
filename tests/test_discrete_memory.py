"""OPENREG_DISCRETE_MEMORY=1: openreg as a device whose memory CPU code cannot
address (docs/porting.md). The routes that run torch's CPU operator kernels
stage copies of their operands to the host and back; launched kernels keep
running on device memory. Each route runs in a subprocess, in the mode and
out of it, under the profiler: the copies it makes are the evidence."""
import json
import os
import subprocess
import sys

import pytest

MODES = ("discrete",)  # the extra CI passes that run this file (tests/conftest.py)

# Its module fixture is built once: one pytest-xdist worker runs the file.
pytestmark = pytest.mark.xdist_group("discrete_memory")

SCRIPT = r"""
import json
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.testing import assert_close

torch.manual_seed(0)
x = torch.randn(6, 5)
i = torch.arange(12, dtype=torch.int32).reshape(3, 4)


def batch_norm(d):
    mean, var = torch.zeros(5, device=d), torch.ones(5, device=d)
    out = torch.nn.functional.batch_norm(x.to(d), mean, var, training=True)
    return out, mean, var  # native_batch_norm updates the statistics its schema does not mark


def shift_view(d):
    t = i.clone().to(d)
    t[:, 1:3].__ilshift__(2)  # in place, on a view
    return t


def cumsum_out(d):
    out = torch.empty(0, device=d)
    torch.cumsum(x.to(d), 0, out=out)  # out= resized by the CPU kernel
    return out


CASES = {  # route: a call on it
    "fallback": lambda d: torch.cdist(x.to(d), x.to(d)),
    "fallback_in_place_view": shift_view,
    "cpu_kernels": batch_norm,
    "cpu_kernels_out_resized": cumsum_out,
    "structured_on_cpu_aliases": lambda d: torch.nn.functional.gelu(x.to(d)),
    "nested_fallback": lambda d: torch.nested.nested_tensor([x[:2], x[:3]], device=d).sin().to_padded_tensor(0.0),
    "sparse_fallback": lambda d: (x.to_sparse().to(d) * 2).to_dense(),
    "native": lambda d: x.to(d) + 1,
}

report = {}
for name, case in CASES.items():
    expected = case("cpu")
    case("openreg")  # compile-free warm-up: first launches run at once
    torch.openreg.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
        got = case("openreg")
        torch.openreg.synchronize()
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected):
        assert g.device.type == "openreg", name
        assert_close(g.cpu(), e, msg=name)
    # Copies the call made besides the .to() of its inputs and the result's .cpu().
    copies = [e.name for e in p.events() if e.name.startswith("Memcpy") and e.device_type == DeviceType.PrivateUse1]
    report[name] = {"DtoH": copies.count("Memcpy DtoH"), "HtoD": copies.count("Memcpy HtoD")}
print(json.dumps(report))
"""

STAGED = [
    "fallback",
    "fallback_in_place_view",
    "cpu_kernels",
    "cpu_kernels_out_resized",
    "structured_on_cpu_aliases",
    "nested_fallback",
    "sparse_fallback",
]


def run(discrete: str | None):
    env = dict(os.environ)
    env.pop("OPENREG_DISCRETE_MEMORY", None)
    if discrete is not None:
        env["OPENREG_DISCRETE_MEMORY"] = discrete
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def copies():
    both = {}
    for mode in ("1", None):
        done = run(mode)
        assert done.returncode == 0, done.stderr[-3000:]
        both[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return both


@pytest.mark.parametrize("route", STAGED)
def test_staged_routes_copy_to_the_host_and_back_and_match_cpu(copies, route):
    aliased, staged = copies[None][route], copies["1"][route]
    # Inputs travel to the device and results back once (the case's own
    # .to() and .cpu()): a staged route adds a copy each way.
    assert staged["DtoH"] > aliased["DtoH"], (route, staged, aliased)
    assert staged["HtoD"] > aliased["HtoD"], (route, staged, aliased)


def test_native_kernels_run_on_device_memory_in_both_modes(copies):
    assert copies["1"]["native"] == copies[None]["native"]


def test_a_value_other_than_0_or_1_is_refused_at_start():
    done = run("yes")
    assert done.returncode != 0
    assert "OPENREG_DISCRETE_MEMORY='yes' is neither 1 nor 0" in done.stderr
