"""TORCH_SHOW_DISPATCH_TRACE=1 prints, on release wheels of torch, one line per
call the openreg backend serves, in torch's trace format plus how it was served."""

import os
import re
import subprocess
import sys

import pytest
import torch

MODES = ("trace",)  # the extra CI passes that run this file (tests/conftest.py)

# torch's own format (Dispatcher.cpp), then " -> " and openreg's route.
LINE = re.compile(r"^(?P<indent> *)\[(?P<kind>call|stub)\] op=\[(?P<op>[^\]]+)\], key=\[PrivateUse1\] -> (?P<route>.+)$")

SCRIPT = """
import torch
a = torch.ones(4, device="openreg")
b = a + a
c = torch.nan_to_num(b)
e = torch.cumsum(a, 0)
f = torch.flip(a, [0])
d = torch.ops.openreg.add_relu(a, b)
try:
    a.pin_memory()
except (NotImplementedError, RuntimeError):
    pass
print(c.sum().item())
"""


def run(script: str, trace: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TORCH_SHOW_DISPATCH_TRACE", None)
    if trace is not None:
        env["TORCH_SHOW_DISPATCH_TRACE"] = trace
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result


def trace_lines(stderr: str) -> list[re.Match]:
    return [m for m in map(LINE.match, stderr.splitlines()) if m]


@pytest.fixture(scope="module")
def traced() -> subprocess.CompletedProcess:
    """SCRIPT run with the trace on, once for the tests that read its trace."""
    return run(SCRIPT, "1")


def test_each_route_prints_a_line_in_torchs_format(traced):
    assert traced.stdout.strip() == "8.0"
    lines = trace_lines(traced.stderr)
    routes = {(m["op"], m["route"]) for m in lines}
    assert ("aten::empty.memory_format", "kernel openreg::native::empty_memory_format") in routes
    assert ("aten::add.Tensor", "structured at::native::structured_ufunc_add_CPU") in routes
    assert ("aten::nan_to_num.out", "fallback") in routes
    assert ("aten::cumsum", "structured_on_cpu_aliases at::native::structured_cumsum_out") in routes
    assert ("aten::flip", "cpu_kernel at::cpu::flip") in routes
    assert ("openreg::add_relu", "custom_op openreg::native::add_relu") in routes
    assert ("aten::_pin_memory", "blocked") in routes
    # Every PrivateUse1 line the script printed is in the expected format.
    printed = [line for line in traced.stderr.splitlines() if "key=[PrivateUse1]" in line]
    assert len(printed) == len(lines)


def test_a_stub_nests_under_the_structured_call_that_reached_it(traced):
    lines = trace_lines(traced.stderr)
    i = next(i for i, m in enumerate(lines) if m["op"] == "aten::add.Tensor")
    stub = lines[i + 1]
    assert stub["kind"] == "stub"
    assert stub["op"] == "add_stub"
    assert stub["route"].startswith(("stub_kernel ", "stub_cpu_kernel "))
    assert len(stub["indent"]) == len(lines[i]["indent"]) + 1


@pytest.mark.parametrize("value", [None, "0"])
def test_nothing_is_printed_when_off(value):
    result = run(SCRIPT, value)
    assert "key=[PrivateUse1]" not in result.stderr
    assert result.stderr == ""


def test_an_invalid_value_gets_torchs_warning_and_no_trace():
    result = run(SCRIPT, "yes")
    assert "ignoring invalid value for TORCH_SHOW_DISPATCH_TRACE: yes" in result.stderr
    assert "key=[PrivateUse1]" not in result.stderr


def test_python_switch_traces_only_inside_the_block(capfd):
    a = torch.ones(3, device="openreg")
    capfd.readouterr()
    with torch.openreg.dispatch_trace():
        assert torch.openreg.is_dispatch_trace_enabled()
        torch.neg(a)
    with torch.openreg.dispatch_trace(False):
        torch.neg(a)
    err = capfd.readouterr().err
    ops = [m["op"] for m in trace_lines(err)]
    assert ops.count("aten::neg") == 1
    assert "neg_stub" in ops


def test_switch_restores_the_previous_state():
    before = torch.openreg.is_dispatch_trace_enabled()
    with torch.openreg.dispatch_trace(not before):
        assert torch.openreg.is_dispatch_trace_enabled() is (not before)
    assert torch.openreg.is_dispatch_trace_enabled() is before


def test_trace_of_a_training_step_is_well_formed(capfd):
    model = torch.nn.Linear(4, 2).to("openreg")
    x = torch.randn(8, 4, device="openreg")
    capfd.readouterr()
    with torch.openreg.dispatch_trace():
        model(x).relu().sum().backward()
    lines = [line for line in capfd.readouterr().err.splitlines() if "key=[PrivateUse1]" in line]
    assert lines
    for line in lines:
        assert LINE.match(line), line
    # Indentation only ever deepens one level at a time.
    depths = [len(LINE.match(line)["indent"]) for line in lines]
    assert all(b <= a + 1 for a, b in zip(depths, depths[1:]))
