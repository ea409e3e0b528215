"""`import torch` loads the backend through the torch.backends entry point."""

import os
import subprocess
import sys

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

def run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, **env),
        capture_output=True, text=True, timeout=120,
    )


def test_import_torch_alone_gives_an_openreg_device():
    result = run("import torch; print(torch.randn(3, device='openreg').device)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "openreg:0"


def test_autoload_can_be_disabled():
    result = run(
        "import sys, torch\n"
        "assert 'torch_openreg' not in sys.modules\n"
        "try:\n"
        "    torch.empty(1, device='openreg')\n"
        "except RuntimeError as e:\n"
        "    print('refused')\n",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused"


def test_bad_device_count_fails_import_torch_with_the_reason():
    result = run("import torch", OPENREG_DEVICE_COUNT="abc")
    assert result.returncode == 1
    assert "OPENREG_DEVICE_COUNT='abc' is not a whole number from 1 to 16" in result.stderr
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.stderr  # torch's own hint


def test_importing_torch_openreg_before_torch_works():
    # torch's autoload then meets the half-imported torch_openreg.
    result = run("import torch_openreg, torch; print(torch.ones(2, device='openreg').sum().item())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2.0"
