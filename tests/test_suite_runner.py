"""The suite's own machinery (tests/conftest.py): under pytest-xdist, a test
marked `exclusive` runs alone; every test file declares its CI passes (MODES)."""

import subprocess
import sys
import threading
import time
import types
import uuid

import pytest

import conftest

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)


def test_an_exclusive_test_waits_for_running_tests_and_holds_back_new_ones(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)  # as in an xdist worker
    events = []
    exclusive_waiting = threading.Event()

    def test(name, exclusive, hold):
        with conftest._run_alone_if(exclusive):
            events.append(f"{name} start")
            time.sleep(hold)
            events.append(f"{name} end")

    running = threading.Thread(target=test, args=("shared", False, 0.5))
    running.start()
    time.sleep(0.1)
    alone = threading.Thread(target=lambda: (exclusive_waiting.set(), test("exclusive", True, 0.3)))
    alone.start()
    exclusive_waiting.wait()
    time.sleep(0.1)
    later = threading.Thread(target=test, args=("later", False, 0))
    later.start()
    for t in (running, alone, later):
        t.join(timeout=30)
    try:
        assert events == ["shared start", "shared end", "exclusive start", "exclusive end", "later start", "later end"]
    finally:
        import shutil

        shutil.rmtree(conftest._lock_dir(), ignore_errors=True)


def test_without_xdist_nothing_waits(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    with conftest._run_alone_if(True):
        with conftest._run_alone_if(True):  # would deadlock if it locked
            pass


def module_with(tmp_path, source: str):
    path = tmp_path / "test_example.py"
    path.write_text(source)
    module = types.ModuleType("test_example")
    module.__file__ = str(path)
    exec(source, module.__dict__)
    return module


def test_a_test_file_must_declare_its_modes(tmp_path):
    with pytest.raises(pytest.UsageError, match="must declare MODES"):
        conftest._declared_modes(module_with(tmp_path, "x = 1\n"))
    with pytest.raises(pytest.UsageError, match="must declare MODES"):
        conftest._declared_modes(module_with(tmp_path, 'MODES = ("fast",)\n'))
    assert conftest._declared_modes(module_with(tmp_path, "MODES = ()\n")) == ()


def test_a_file_that_uses_what_a_switch_changes_must_name_its_mode(tmp_path):
    # (The calls are spelt in pieces: this file's own source is checked too.)
    source = 'MODES = ("trace",)\nimport torch\ndef test_x():\n    torch.openreg._sl' + 'eep(5)\n'
    with pytest.raises(pytest.UsageError, match=r"QUEUE_ALL_KERNELS=1.*'queue_all', 'blocking'"):
        conftest._declared_modes(module_with(tmp_path, source))
    fixed = source.replace('("trace",)', '("queue_all", "blocking")')
    assert conftest._declared_modes(module_with(tmp_path, fixed)) == ("queue_all", "blocking")
    with pytest.raises(pytest.UsageError, match="'trace'"):
        conftest._declared_modes(module_with(tmp_path, "MODES = ()\ndef test_x(cap" + "fd):\n    pass\n"))


def test_a_test_narrows_its_files_modes_with_the_modes_marker():
    def item(*marks):
        markers = {m.name: m for m in marks}
        return types.SimpleNamespace(nodeid="test_x.py::test_x", get_closest_marker=markers.get)

    declared = ("queue_all", "blocking")
    assert conftest._item_modes(item(), declared) == declared
    assert conftest._item_modes(item(pytest.mark.modes().mark), declared) == ()
    assert conftest._item_modes(item(pytest.mark.modes("blocking").mark), declared) == ("blocking",)
    with pytest.raises(pytest.UsageError, match=r"test_x.py::test_x: pytest.mark.modes\('trace',\) names passes"):
        conftest._item_modes(item(pytest.mark.modes("trace").mark), declared)


def test_a_pass_of_one_mode_imports_only_the_files_that_name_it(tmp_path):
    config = types.SimpleNamespace(getoption=lambda name, default=None: "queue_all")
    named, other, broken = tmp_path / "test_named.py", tmp_path / "test_other.py", tmp_path / "test_broken.py"
    named.write_text('MODES = ("trace", "queue_all")  # comment\n')
    other.write_text("MODES = ()\n")
    broken.write_text("x = 1\n")
    assert conftest.pytest_ignore_collect(named, config) is False
    assert conftest.pytest_ignore_collect(other, config) is True
    assert conftest.pytest_ignore_collect(broken, config) is None  # imported, and refused there
    whole = types.SimpleNamespace(getoption=lambda name, default=None: "")
    assert conftest.pytest_ignore_collect(other, whole) is None


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    # The suite's module fixtures (a two-rank launch, compiled packages) are built
    # once only if their file's tests stay together; pytest 9 broke that.
    grouped = "import os, pytest\npytestmark = pytest.mark.xdist_group('g')\n" + "".join(
        f"def test_{i}():\n    open('workers', 'a').write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        for i in range(8)
    )
    (tmp_path / "test_grouped.py").write_text(grouped)
    (tmp_path / "test_other.py").write_text("".join(f"def test_{i}():\n    pass\n" for i in range(8)))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-p", "no:openreg",
         "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    workers = (tmp_path / "workers").read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers
