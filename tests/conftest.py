import pytest
import torch

# `import torch` autoloads the backend when it is installed; importing it here
# too keeps the suite runnable with TORCH_DEVICE_BACKEND_AUTOLOAD=0.
import torch_openreg  # noqa: F401


@pytest.fixture(autouse=True)
def _restore_current_device():
    """Tests that switch the current device must not leak it into the next test."""
    before = torch.openreg.current_device()
    yield
    torch.openreg.set_device(before)


@pytest.fixture(autouse=True, scope="session")
def _report_device_memory_faults_first():
    """pytest enables faulthandler after this file imported torch; put openreg's
    report of host accesses to device memory back in front of it."""
    torch_openreg._C._install_fault_handler()


def pytest_terminal_summary(terminalreporter):
    import opinfo_report

    for line in opinfo_report.summary_lines():
        terminalreporter.write_line(line)
