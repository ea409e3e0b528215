"""torch.openreg.sanitizer: each kind of stream synchronisation bug is reported
once, with the streams and the lines of both accesses, and its fixed program
is not reported at all. Reports come from the order the program sets up, so
they do not depend on how the streams happened to run."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import torch_openreg  # noqa: F401

MODES = ("trace", "queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

sanitizer = torch.openreg.sanitizer


@pytest.fixture
def checked():
    """A sanitizer that has seen nothing before the test (the suite may run
    with TORCH_OPENREG_SANITIZER=1: its state is put back after)."""
    from torch.cuda._sanitizer import CUDASanitizerErrors

    was_enabled = sanitizer.is_enabled()
    torch.openreg.synchronize()
    sanitizer.disable()
    sanitizer.enable()
    try:
        yield CUDASanitizerErrors
    finally:
        sanitizer.disable()
        if was_enabled:
            sanitizer.enable()


def one_report(err: str) -> str:
    assert err.count("============================") == 1, err
    return err


def side_stream():
    return torch.openreg.Stream()


# 1. unsynchronised accesses from two streams


def test_read_of_another_streams_write_is_reported_once_with_both_lines(checked, capsys):
    side = side_stream()
    x = torch.zeros(4096, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        x.add_(1)  # WRITE-ON-SIDE
    with pytest.raises(checked):
        x[1:].sum()  # READ-ON-DEFAULT (a view: the race is on the storage)
    report = one_report(capsys.readouterr().err)
    assert "openreg:0 stream 0" in report and f"openreg:0 stream {side.stream_id}" in report
    assert "# WRITE-ON-SIDE" in report and "# READ-ON-DEFAULT" in report


def test_read_after_wait_stream_is_not_reported(checked, capsys):
    side = side_stream()
    x = torch.zeros(4096, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        x.add_(1)
    torch.openreg.current_stream().wait_stream(side)
    x[1:].sum()
    assert capsys.readouterr().err == ""


def test_write_after_another_streams_read_is_reported(checked, capsys):
    side = side_stream()
    x = torch.zeros(4096, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        y = x * 2  # READ-ON-SIDE
    with pytest.raises(checked):
        x.fill_(3)  # WRITE-ON-DEFAULT
    report = one_report(capsys.readouterr().err)
    assert "# READ-ON-SIDE" in report and "# WRITE-ON-DEFAULT" in report
    del y


def test_event_and_synchronize_order_streams(checked, capsys):
    side = side_stream()
    x = torch.zeros(4096, device="openreg")
    done = torch.openreg.Event()
    done.record()
    with torch.openreg.stream(side):
        done.wait()
        x.add_(1)
        done.record()
    done.wait()
    x.mul_(2)
    torch.openreg.synchronize()
    with torch.openreg.stream(side):
        x.add_(1)
    side.synchronize()
    x.sub_(1)
    assert x.sum().item() == 4096 * 2
    assert capsys.readouterr().err == ""


def test_disjoint_slices_written_on_two_streams_are_not_reported(checked, capsys):
    side = side_stream()
    x = torch.zeros(4096, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    x[:2048].fill_(1)
    with torch.openreg.stream(side):
        x[2048:].fill_(2)
    torch.openreg.current_stream().wait_stream(side)
    assert x.sum().item() == 2048 + 2 * 2048
    assert capsys.readouterr().err == ""


# 2. memory freed while another stream may still use it


def test_free_without_record_stream_is_reported_once_with_both_lines(checked, capsys):
    side = side_stream()
    x = torch.ones(4096, device="openreg")  # allocated on the default stream
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        y = x * 2  # USE-ON-SIDE
    del x  # FREE-ON-DEFAULT
    report = one_report(capsys.readouterr().err)  # printed when freed...
    with pytest.raises(checked):
        torch.empty(1, device="openreg")  # ...raised by the next operator
    assert "freed while" in report
    assert "openreg:0 stream 0" in report and f"openreg:0 stream {side.stream_id}" in report
    assert "# USE-ON-SIDE" in report and "# FREE-ON-DEFAULT" in report
    assert capsys.readouterr().err == ""
    del y


@pytest.mark.parametrize("fix", ["record_stream", "wait_stream", "synchronize"])
def test_free_after_record_stream_or_a_wait_is_not_reported(checked, capsys, fix):
    side = side_stream()
    x = torch.ones(4096, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        y = x * 2
    if fix == "record_stream":
        x.record_stream(side)
    elif fix == "wait_stream":
        torch.openreg.current_stream().wait_stream(side)
    else:
        side.synchronize()
    del x
    torch.empty(1, device="openreg")
    assert capsys.readouterr().err == ""
    del y


# 3. host reads of a non_blocking device-to-host copy


def test_host_read_before_synchronizing_a_non_blocking_copy_is_reported_once(checked, capsys):
    x = torch.arange(4096.0, device="openreg")
    host = torch.empty(4096, pin_memory=True)
    host.copy_(x, non_blocking=True)  # ASYNC-COPY
    with pytest.raises(checked):
        host[10:].sum()  # HOST-READ
    report = one_report(capsys.readouterr().err)
    assert "non_blocking" in report and "openreg:0 stream 0" in report
    assert "# ASYNC-COPY" in report and "# HOST-READ" in report


@pytest.mark.parametrize("read", ["numpy", "tolist", "item"])
def test_host_reads_that_skip_dispatch_are_seen(checked, capsys, read):
    x = torch.arange(16.0, device="openreg")
    host = x.to("cpu", non_blocking=True)  # ASYNC-TO
    assert host.is_pinned()
    with pytest.raises(checked):
        getattr(host[0] if read == "item" else host, read)()  # READ-CALL
    report = one_report(capsys.readouterr().err)
    assert "# ASYNC-TO" in report and "# READ-CALL" in report


@pytest.mark.parametrize("fix", ["device", "stream", "event"])
def test_host_read_after_synchronizing_is_not_reported(checked, capsys, fix):
    x = torch.arange(4096.0, device="openreg")
    host = torch.empty(4096, pin_memory=True)
    host.copy_(x, non_blocking=True)
    if fix == "device":
        torch.openreg.synchronize()
    elif fix == "stream":
        torch.openreg.current_stream().synchronize()
    else:
        done = torch.openreg.Event()
        done.record()
        done.synchronize()
    assert host.sum().item() == sum(range(4096))
    assert host.tolist()[5] == 5.0 and host.numpy()[7] == 7.0
    assert capsys.readouterr().err == ""


def test_pageable_non_blocking_copy_is_synchronous_and_not_reported(checked, capsys):
    x = torch.arange(16.0, device="openreg")
    host = torch.empty(16)
    host.copy_(x, non_blocking=True)
    assert host.sum().item() == sum(range(16))
    assert capsys.readouterr().err == ""


# switching it on and off


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_OPENREG_SANITIZER"}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True, text=True, timeout=300
    )


RACE = """
    import torch
    side = torch.openreg.Stream()
    x = torch.zeros(4096, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        x.add_(1)
    x.sum()
    print("not reported")
"""


def test_environment_variable_enables_it():
    result = run(RACE, TORCH_OPENREG_SANITIZER="1")
    assert result.returncode != 0
    assert "CUDASanitizerErrors" in result.stderr and "data race" in result.stderr
    assert "not reported" not in result.stdout


def test_disabled_by_default_and_nothing_installed():
    result = run(
        RACE
        + """
    import sys
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    assert not torch.openreg.sanitizer.is_enabled()
    assert _get_current_dispatch_mode_stack() == []
    # CSAN's module activates c10's GPU trace when imported: it never was.
    assert "torch.cuda._sanitizer" not in sys.modules
    print("clean")
    """
    )
    assert result.returncode == 0, result.stderr
    assert "not reported" in result.stdout and "clean" in result.stdout


@pytest.mark.modes()  # a child process's start-up, the same under every launch switch
def test_malformed_environment_variable_is_an_error_naming_it():
    result = run("import torch_openreg", TORCH_OPENREG_SANITIZER="yes")
    assert result.returncode != 0
    assert "TORCH_OPENREG_SANITIZER='yes' is not valid" in result.stderr


def test_disable_removes_the_mode(checked):
    assert any(type(m).__name__ == "SanitizerMode" for m in _get_current_dispatch_mode_stack())
    sanitizer.disable()
    assert not any(type(m).__name__ == "SanitizerMode" for m in _get_current_dispatch_mode_stack())
    assert not sanitizer.is_enabled()


def test_graph_capture_and_replay_are_not_reported(checked, capsys):
    """What a graph records is not checked (docs/integration/streams.md, "Sanitizer"): a capture
    on its side stream, replays on the default stream, the static output read and
    freed there make no report, and checks go on after."""
    x = torch.ones(4096, device="openreg")
    g = torch.openreg.OpenRegGraph()
    with torch.openreg.graph(g):
        y = (x * 2).sum()
    for _ in range(2):
        g.replay()
        assert y.item() == 8192.0
    del g, y
    assert capsys.readouterr().err == ""
    side = side_stream()
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        x.add_(1)
    with pytest.raises(checked):
        x.sum()  # still checked
    one_report(capsys.readouterr().err)


@pytest.mark.parametrize("fixed", [False, True], ids=["race", "fixed"])
def test_compiled_code_is_checked_as_its_operators(checked, capsys, fixed):
    """While a TorchDispatchMode is active, dynamo runs a compiled function's
    frame eagerly (as under CSAN on CUDA), also a function compiled before the
    sanitizer was enabled: its operators are checked like any others."""
    compiled = torch.compile(lambda x: (x * 3 + 1).cos(), backend="inductor")
    x = torch.ones(4096, device="openreg")
    sanitizer.disable()
    compiled(x)  # compiled here, without the sanitizer
    torch.openreg.synchronize()
    sanitizer.enable()
    x.fill_(2.0)  # WRITE-ON-DEFAULT
    side = side_stream()
    if fixed:
        side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        if fixed:
            compiled(x)
        else:
            with pytest.raises(checked):
                compiled(x)  # READ-ON-SIDE
    if fixed:
        assert capsys.readouterr().err == ""
    else:
        report = one_report(capsys.readouterr().err)
        assert "# WRITE-ON-DEFAULT" in report and "# READ-ON-SIDE" in report
