"""torch.openreg.fallback_stats() and the three fallback modes (OPENREG_FALLBACK)."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)


@pytest.fixture(autouse=True)
def _silent_and_counted_from_zero():
    before = torch.openreg.get_fallback_mode()
    torch.openreg.set_fallback_mode("silent")
    torch.openreg.reset_fallback_stats()
    yield
    torch.openreg.set_fallback_mode(before)


def test_counts_each_fallback_operator():
    a = torch.tensor([-1.0, 2.0], device="openreg")
    torch.nan_to_num(a)
    torch.nan_to_num(a)
    torch.logcumsumexp(a, 0)
    assert torch.openreg.fallback_stats() == {"aten::nan_to_num.out": 2, "aten::_logcumsumexp": 1}


def test_native_operators_are_not_counted():
    a = torch.ones(3, device="openreg")
    (a + a).neg().sum()
    assert torch.openreg.fallback_stats() == {}


def test_reset_starts_from_zero():
    torch.nan_to_num(torch.ones(2, device="openreg"))
    torch.openreg.reset_fallback_stats()
    assert torch.openreg.fallback_stats() == {}


def test_a_failed_fallback_is_not_counted():
    with pytest.raises(RuntimeError):
        torch.mm(torch.ones(2, 3, device="openreg"), torch.ones(2, 3, device="openreg"))
    assert torch.openreg.fallback_stats() == {}


def test_warn_mode_warns_once_per_operator():
    torch.openreg.set_fallback_mode("warn")
    a = torch.ones(2, device="openreg")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.nan_to_num(a)
        torch.nan_to_num(a)
        torch.logcumsumexp(a, 0)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert "aten::nan_to_num.out has no openreg kernel" in messages[0]
    assert "backend_functions.yaml" in messages[0]
    assert "aten::_logcumsumexp" in messages[1]
    assert torch.openreg.fallback_stats() == {"aten::nan_to_num.out": 2, "aten::_logcumsumexp": 1}


def test_error_mode_raises_naming_the_operator_and_the_fix():
    a = torch.tensor([-1.0, 2.0], device="openreg")
    torch.openreg.set_fallback_mode("error")
    with pytest.raises(NotImplementedError, match=r"aten::nan_to_num\.out has no openreg kernel.*backend_functions\.yaml"):
        torch.nan_to_num(a)
    # Native operators still run, and nothing ran on the fallback.
    assert (a + a).cpu().tolist() == [-2.0, 4.0]
    assert torch.openreg.fallback_stats() == {}
    torch.openreg.set_fallback_mode("silent")
    assert torch.nan_to_num(a).cpu().tolist() == [-1.0, 2.0]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown fallback mode 'loud'"):
        torch.openreg.set_fallback_mode("loud")
    with pytest.raises(TypeError):
        torch.openreg.set_fallback_mode(1)
    assert torch.openreg.get_fallback_mode() == "silent"


def run(code: str, mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPENREG_FALLBACK=mode)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mode", ["warn", "silent", "WARN"])
def test_environment_sets_the_mode(mode):
    result = run("import torch; print(torch.openreg.get_fallback_mode())", mode)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == mode.lower()


def test_environment_error_mode_stops_a_fallback():
    result = run("import torch; print(torch.openreg.get_fallback_mode())\n"
                 "torch.nan_to_num(torch.ones(2, device='openreg'))", "error")
    assert result.stdout.strip() == "error"
    assert result.returncode == 1
    assert "NotImplementedError: aten::nan_to_num.out has no openreg kernel" in result.stderr


def test_malformed_environment_fails_the_import_with_the_reason():
    result = run("import torch", "sometimes")
    assert result.returncode == 1
    assert "OPENREG_FALLBACK='sometimes' is not a fallback mode: use silent, warn or error" in result.stderr
