"""When an error raises (docs/integration/streams.md, "When errors raise"): an argument
error, anything checkable without reading device data, raises at the call in
every route, in a fresh process (the operator's first call) as in a warm one
(its kernels already queued behind busy work); a fault that depends on the
data raises at the call when its kernel runs in the calling thread, otherwise
at the next synchronising call, as an AcceleratorError naming the operator.
After either, the memory the call allocated is freed and the device works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

BLOCKING = os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1"

# route -> (setup, a good call, the bad call); `x` is 4,096 floats on openreg,
# so that a warm call's kernel is queued rather than run at once.
ARGUMENT_ERRORS = {
    "kernels (copy_)": ("y = torch.randn(2, 1, 2, 1, device=d)", "x.copy_(x.flip(0))", "x[:1].copy_(y)"),
    "kernels (index_select out=)": (
        "i = torch.tensor([0, 1], device=d); o = torch.empty(2, 1, device=d).expand(2, 64)",
        "torch.index_select(x.view(64, 64), 0, i)",
        "torch.index_select(x.view(64, 64), 0, i, out=o)",
    ),
    "structured": ("y = torch.randn(3, device=d)", "x + x", "x + y"),
    "structured on CPU aliases": ("", "torch.cumsum(x, 0)", "torch.cumsum(x, 5)"),
    "stub kernels": ("m = torch.ones((), dtype=torch.bool, device=d)", "x.masked_fill(m, 1.0)", "x.masked_fill(m, 1j)"),
    "cpu_kernels": (
        "a = torch.randn(64, device=d)",
        "torch.addr(x.view(64, 64), a, a)",
        "torch.addr(x.view(64, 64), a, a, beta=True)",
    ),
    "fallback": ("", "torch.kthvalue(x, 3)", "torch.kthvalue(x, 5000)"),
    "custom operators": ("y = torch.randn(3, device=d)", "torch.ops.openreg.add_relu(x, x)", "torch.ops.openreg.add_relu(x, y)"),
}

SCRIPT = """
import gc, json, sys, torch
d = "openreg"
routes = json.loads(sys.argv[1])
out = {}

def outcome(code, scope):
    try:
        exec(code, scope)
    except Exception as e:
        return "call:" + type(e).__name__
    try:
        torch.openreg.synchronize()
    except Exception as e:
        return "sync:" + type(e).__name__ + ":" + str(e).splitlines()[0][:80]
    return "none"

for route, (setup, good, bad) in routes.items():
    for when in ("fresh", "warm"):
        scope = {"torch": torch, "d": d, "x": torch.randn(4096, device=d)}
        exec(setup, scope)
        torch.openreg.synchronize()
        if when == "warm":
            for _ in range(2):
                exec(good, scope)
            torch.openreg._sleep(50)  # busy: what follows is queued
        base = torch.openreg.memory_allocated()
        result = outcome(bad, scope)
        gc.collect()
        leaked = torch.openreg.memory_allocated() - base
        works = torch.equal((torch.ones(3, device=d) * 2).cpu(), torch.full((3,), 2.0))
        out[route + "/" + when] = [result, leaked, works]
print(json.dumps(out))
"""


def run(routes: dict) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), json.dumps(routes)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_argument_errors_raise_at_the_call_in_every_route_fresh_and_warm():
    results = run(ARGUMENT_ERRORS)
    wrong = {k: v for k, v in results.items() if not v[0].startswith("call:") or v[1] != 0 or not v[2]}
    assert not wrong, f"[outcome, bytes leaked, device works] per route/process state: {wrong}"


def test_a_data_fault_raises_at_the_call_when_run_at_once_and_at_the_next_synchronisation_when_queued():
    # An index out of range is known only from the index's values: on the
    # operator's first call its kernel runs in the calling thread; behind
    # queued work it is queued, and the fault is the stream's.
    results = run({"index": ("i = torch.tensor([0, 5000], device=d)", "x[torch.tensor([0, 1], device=d)]", "x[i]")})
    fresh, warm = results["index/fresh"], results["index/warm"]
    assert fresh[0] == "call:IndexError", fresh
    if BLOCKING:
        assert warm[0] == "call:IndexError", warm
    else:
        assert warm[0].startswith("sync:AcceleratorError:") and "index_stub" in warm[0], warm
    assert fresh[1:] == [0, True] and warm[1:] == [0, True]


# openreg::add_relu has no CPU kernel: openreg is its only device.
@pytest.mark.parametrize("route", sorted(r for r in ARGUMENT_ERRORS if r != "custom operators"))
def test_each_bad_call_is_an_error_on_cpu_too(route):
    """The bad calls above are argument errors on CPU (the oracle), not openreg's own."""
    import torch

    setup, good, bad = ARGUMENT_ERRORS[route]
    scope = {"torch": torch, "d": "cpu", "x": torch.randn(4096)}
    exec(setup, scope)
    exec(good, scope)
    with pytest.raises(Exception):
        exec(bad, scope)
