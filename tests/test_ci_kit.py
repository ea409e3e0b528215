"""What a library author wires openreg into CI with (docs/ci.md): the pytest plugin
(torch_openreg/pytest_plugin.py), run by pytester on a small test file in a
subprocess (inert without its options; --openreg makes openreg the default
device; --openreg-leak-check fails a leaking test; --openreg-strict fails a test
that falls back; the summary names fallbacks and host synchronisations), and the
transformers device spec."""

import pytest
import torch

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

pytest_plugins = ["pytester"]

# Each case starts a Python that imports torch: one worker runs them all.
pytestmark = pytest.mark.xdist_group("pytest_plugin")

EXAMPLE = """
import torch

kept = []

def test_default_device():
    assert torch.randn(2).device.type == DEVICE

def test_clean():
    x = torch.ones(1024, device="openreg")
    assert x.sum().item() == 1024

def test_leaks():
    kept.append(torch.ones(1000, device="openreg"))

def test_falls_back():
    assert torch.trace(torch.ones(3, 3, device="openreg")).item() == 3

def test_waits_three_times():
    x = torch.ones(3, device="openreg")
    for _ in range(3):
        x.sum().item()
"""


def run(pytester, *args, device="openreg"):
    pytester.makepyfile(test_example=EXAMPLE.replace("DEVICE", repr(device)))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_without_its_options_the_plugin_changes_nothing(pytester):
    result = run(pytester, device="cpu")
    result.assert_outcomes(passed=5)
    assert "openreg" not in result.stdout.str().split("short test summary")[0].split("passed")[-1]
    assert "= openreg =" not in result.stdout.str()


def test_openreg_makes_it_the_default_device_and_summarises(pytester):
    result = run(pytester, "--openreg")
    result.assert_outcomes(passed=5)
    out = result.stdout.str()
    assert "= openreg =" in out
    assert "1 test(s) ran operators on the CPU fallback:" in out
    assert "test_example.py::test_falls_back: aten::trace (1x)" in out
    assert "test_example.py::test_waits_three_times" in out.split("most in:")[1]


def test_leak_check_fails_the_leaking_test_and_strict_the_one_on_the_cpu_fallback(pytester):
    result = run(pytester, "--openreg-leak-check", "--openreg-strict", "-k", "clean or leaks or falls_back")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "FAILED test_example.py::test_leaks" in out and "FAILED test_example.py::test_falls_back" in out
    assert "openreg: the test ended with more device memory allocated than it started with: " in out and "bytes on openreg:0" in out
    assert "openreg: ran on the CPU fallback: aten::trace (1x)" in out
    assert "pytest_plugin.py" not in out  # the checks' messages, not a traceback of the plugin


def test_an_option_given_a_value_is_a_usage_error(pytester):
    # Refused while the options are parsed, before the plugin configures anything: in this process.
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--openreg-strict=yes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ignored explicit argument 'yes'" in result.stderr.str()


def test_the_transformers_device_spec_gives_transformers_tests_the_device(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    import torch_openreg.transformers_device_spec as spec

    shutil.copy(spec.__file__, tmp_path / "openreg_spec.py")
    code = (
        "import torch\n"
        "from transformers.testing_utils import backend_device_count, backend_manual_seed, torch_device\n"
        "backend_manual_seed(torch_device, 7); a = torch.randn(3, device=torch_device)\n"
        "torch.openreg.manual_seed(7); b = torch.randn(3, device='openreg')\n"
        "print(torch_device, backend_device_count(torch_device), torch.equal(a.cpu(), b.cpu()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TRANSFORMERS_TEST_DEVICE_SPEC": "openreg_spec.py"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-3:] == ["openreg", str(torch.openreg.device_count()), "True"]
