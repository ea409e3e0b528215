"""The suite's own machinery (tests/conftest.py): under pytest-xdist, a test
marked `exclusive` runs alone."""

import threading
import time
import uuid

import conftest


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
