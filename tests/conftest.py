import contextlib
import fcntl
import gc
import json
import os
import shutil
import tempfile

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


@pytest.fixture(autouse=True)
def _no_kernel_error_left():
    """Kernels run asynchronously: a kernel error a test leaves behind would be
    raised by whichever later test synchronises first. Waiting for every
    device here reports it as an error of the test that launched the kernel."""
    yield
    for device in range(torch.openreg.device_count()):
        torch.openreg.synchronize(device)


@pytest.fixture(autouse=True, scope="session")
def _report_device_memory_faults_first():
    """pytest enables faulthandler after this file imported torch; put openreg's
    report of host accesses to device memory back in front of it."""
    torch_openreg._C._install_fault_handler()


def pytest_collection_finish(session):
    """Everything imported so far (torch, the OpInfo and ModuleInfo databases,
    transformers) lives until the end: gc.freeze() takes it out of the
    collector's sight, so the gc.collect() of tests that count device memory
    scans only what tests create (about 5 ms instead of 350)."""
    gc.freeze()


# Tests marked `exclusive` run alone, also under pytest-xdist (`-n auto`, as in
# the README): while one runs, the other workers wait between tests. A
# readers-writer lock over files shared by the run's workers: every test holds
# the main lock shared, an exclusive test holds it exclusively; taking the
# turnstile first keeps a waiting exclusive test from being overtaken by the
# other workers' next tests.
def _lock_dir(run: str | None = None) -> str | None:
    run = run or os.environ.get("PYTEST_XDIST_TESTRUNUID")  # set in xdist workers only
    return os.path.join(tempfile.gettempdir(), f"openreg-pytest-{run}") if run else None


@contextlib.contextmanager
def _run_alone_if(exclusive: bool):
    directory = _lock_dir()
    if directory is None:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "turnstile"), "a") as turnstile, \
            open(os.path.join(directory, "tests"), "a") as tests:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(tests, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with _run_alone_if(item.get_closest_marker("exclusive") is not None):
        return (yield)


# Under pytest-xdist the OpInfo and ModuleInfo figures are recorded in the
# workers; each sends its share to the controller, which prints the summary.
def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):
        import opinfo_report

        session.config.workeroutput["opinfo_report"] = json.dumps(opinfo_report.state())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    import opinfo_report

    if "opinfo_report" in getattr(node, "workeroutput", {}):
        opinfo_report.merge(json.loads(node.workeroutput["opinfo_report"]))
    # A worker still running reopens its lock files by name, on a new directory.
    shutil.rmtree(_lock_dir(node.workerinput["testrunuid"]), ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    import opinfo_report

    for line in opinfo_report.summary_lines():
        terminalreporter.write_line(line)
