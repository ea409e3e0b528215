import ast
import contextlib
import fcntl
import functools
import gc
import inspect
import json
import os
import re
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


COUNTS_MEMORY = re.compile(r"memory_(allocated|reserved|stats)")


@pytest.fixture(autouse=True)
def _collect_garbage_before_counting_memory(request):
    """Earlier tests' reference cycles may hold device memory, which the
    collector would otherwise free in the middle of a test that counts it."""
    if request.function is not None and COUNTS_MEMORY.search(_function_source(request.function)):
        gc.collect()


@functools.cache
def _function_source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):  # made at run time: no source to read
        return ""


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


# -- the extra CI passes ------------------------------------------------------------------
# .ci/run runs the whole suite, then once per switch below only the tests whose
# behaviour the switch changes: `python -m pytest -m <mode>` with the switch set. Every
# test file names those modes in a module-level MODES tuple, and a file whose source
# uses what a switch changes must name its mode, so the selection stays true as tests
# are added (docs/development.md, "The suite's time").
LAUNCH = re.compile(
    r"_sleep\(|AcceleratorError|OPENREG_LAUNCH_BLOCKING|OPENREG_QUEUE_ALL_KERNELS|(openreg|torch|accelerator)\."
    r"(Stream|Event)\(|sanitizer|graphs?\.|current_stream|queued\("
)
MODES = {
    # mode: (the switch, what in a test file's source makes the switch matter)
    "trace": ("TORCH_SHOW_DISPATCH_TRACE=1", re.compile(r"dispatch_trace|TORCH_SHOW_DISPATCH_TRACE|capfd|capsys")),
    "queue_all": ("OPENREG_QUEUE_ALL_KERNELS=1", LAUNCH),
    "blocking": ("OPENREG_LAUNCH_BLOCKING=1", LAUNCH),
    # CPU operator kernels on host copies of device memory (docs/porting.md)
    "discrete": ("OPENREG_DISCRETE_MEMORY=1", re.compile(r"OPENREG_DISCRETE_MEMORY")),
}


def pytest_ignore_collect(collection_path, config):
    """In a pass of one mode (`-m queue_all`), a test file that does not name
    the mode is not even imported (its MODES read from the source): importing
    torch's OpInfo database or transformers for no test costs seconds per worker."""
    mode = config.getoption("markexpr", "").strip()
    if mode not in MODES or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    declared = re.search(r"^MODES = (\(.*?\))", collection_path.read_text(), flags=re.M)
    try:
        return mode not in ast.literal_eval(declared.group(1)) if declared else None
    except (ValueError, SyntaxError):
        return None  # _declared_modes names the mistake when the file is imported


def _declared_modes(module) -> tuple[str, ...]:
    path = os.path.relpath(module.__file__)
    declared = getattr(module, "MODES", None)
    if not isinstance(declared, tuple) or not set(declared) <= set(MODES):
        raise pytest.UsageError(
            f"{path} must declare MODES, a tuple of the extra CI passes whose switch changes its tests' "
            f"behaviour, among {sorted(MODES)} (() for none); docs/development.md says how to choose."
        )
    with open(module.__file__) as f:
        source = f.read()
    missing = [m for m, (switch, uses) in MODES.items() if m not in declared and uses.search(source)]
    if missing:
        raise pytest.UsageError(
            f"{path} uses what {', '.join(MODES[m][0] for m in missing)} changes "
            f"({', '.join(sorted({MODES[m][1].search(source).group(0) for m in missing}))}): add "
            f"{', '.join(repr(m) for m in missing)} to its MODES."
        )
    return declared


def _item_modes(item, declared: tuple[str, ...]) -> tuple[str, ...]:
    """The file's MODES, or those a test narrows them to with pytest.mark.modes(...)
    (a test whose checks the switch does not change: a child process that fails at
    start-up on a bad setting runs the same under every launch switch)."""
    narrowed = item.get_closest_marker("modes")
    if narrowed is None:
        return declared
    if not set(narrowed.args) <= set(declared):
        raise pytest.UsageError(
            f"{item.nodeid}: pytest.mark.modes{narrowed.args} names passes its file's MODES {declared} lacks"
        )
    return narrowed.args


def pytest_collection_modifyitems(config, items):
    checked = {}
    for item in items:
        module = item.module
        if module.__name__ not in checked:
            checked[module.__name__] = _declared_modes(module)
        for mode in _item_modes(item, checked[module.__name__]):
            item.add_marker(mode)


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
