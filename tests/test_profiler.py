"""Profiling openreg: kernels and copies reach torch.profiler as PrivateUse1 device
events, linked to the CPU operator that issued them, and give it device time; the
autograd profiler's use_device="openreg" measures device time with openreg events.
See docs/integration/profiler.md."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch_openreg
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.testing import assert_close

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

DEVICE_ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


@pytest.fixture(autouse=True)
def _idle_devices():
    yield
    for i in range(torch.openreg.device_count()):
        torch.openreg.synchronize(i)


def profiled(fn, activities=DEVICE_ACTIVITIES):
    with profile(activities=activities) as p:
        result = fn()
    return p, result


def device_events(p, prefix=""):
    return [e for e in p.events() if e.device_type == DeviceType.PrivateUse1 and e.name.startswith(prefix)]


def cpu_ops(p, name):
    """CPU events called `name` (any overload), outermost first."""
    return [e for e in p.events() if e.device_type == DeviceType.CPU and e.name == name]


def linked_op(p, device_event):
    """The CPU event a device event belongs to (by correlation id)."""
    ops = [e for e in p.events() if e.device_type == DeviceType.CPU and e.id == device_event.linked_correlation_id]
    assert len(ops) == 1, f"{device_event.name} belongs to no CPU op (correlation {device_event.linked_correlation_id})"
    return ops[0]


def linked_to(p, op):
    return [e for e in device_events(p) if e.linked_correlation_id == op.id]


def elapsed(events):
    return sum(e.time_range.elapsed_us() for e in events)


# -- kernels ------------------------------------------------------------------------


def test_fallback_kernel_is_a_device_event_that_gives_its_op_device_time():
    x = torch.randn(20, 40)  # 800 elements: a small kernel (below kSmallKernel)
    d = x.to("openreg")
    torch.cumsum(d, 0)  # the first launch of a dtype combination runs in the calling thread
    p, y = profiled(lambda: torch.cumsum(d, 0))
    assert_close(y.cpu(), torch.cumsum(x, 0))

    (kernel,) = device_events(p)
    assert kernel.name.startswith("aten::cumsum") and kernel.device_index == 0
    op = linked_op(p, kernel)
    assert op.name == "aten::cumsum"
    # The kernel is that call's device time and that of the calls enclosing it. A
    # small kernel on an idle stream runs inside its call; with
    # OPENREG_QUEUE_ALL_KERNELS=1 it is queued and may end after the call returned.
    assert op.time_range.start <= kernel.time_range.start <= kernel.time_range.end
    queued = os.environ.get("OPENREG_QUEUE_ALL_KERNELS") == "1" and os.environ.get("OPENREG_LAUNCH_BLOCKING") != "1"
    if not queued:
        assert kernel.time_range.end <= op.time_range.end
    assert kernel.time_range.elapsed_us() > 0
    assert [k.name for k in op.kernels] == [kernel.name]
    outermost = cpu_ops(p, "aten::cumsum")[0]
    assert outermost.device_time_total == pytest.approx(kernel.time_range.elapsed_us())


@pytest.mark.exclusive  # timed against a 50 ms stream sleep
def test_kernel_starts_when_earlier_work_on_its_stream_is_done():
    # A kernel queued behind others starts once they are done, as on a GPU: the
    # wait is neither the call's (it returns at once) nor the kernel's. With
    # OPENREG_LAUNCH_BLOCKING=1 the call waits instead.
    d = torch.randn(64, 64, device="openreg")
    torch.cumsum(d, 0)  # the first launch of a dtype combination runs in the calling thread

    def run():
        torch.openreg._sleep(50)
        out = torch.cumsum(d, 0)
        torch.openreg.synchronize()
        return out

    p, _ = profiled(run)
    (kernel,) = device_events(p)
    op = linked_op(p, kernel)
    assert kernel.time_range.start - op.time_range.start >= 40_000
    assert kernel.time_range.elapsed_us() < 40_000
    if os.environ.get("OPENREG_LAUNCH_BLOCKING", "0") == "1":
        assert op.time_range.elapsed_us() >= 40_000
    else:
        assert op.time_range.elapsed_us() < 40_000


def test_calls_that_touch_no_device_memory_are_not_kernels():
    d = torch.randn(4, 4, device="openreg")

    def run():
        torch.empty(16, device="openreg")
        d.view(16).t()
        with pytest.raises(NotImplementedError, match="blocked on openreg"):
            torch.ops.aten._pin_memory(d)  # a blocked operator: its scope opens, then it raises

    p, _ = profiled(run)
    assert device_events(p) == []


def test_kernel_on_the_second_device_is_attributed_to_it():
    d = torch.randn(8, 8, device="openreg:1")
    assert torch.openreg.current_device() == 0
    # A queued kernel is recorded when it runs: synchronize its device (the
    # profiler's exit synchronizes the current one only).
    p, _ = profiled(lambda: (torch.cumsum(d, 1), torch.openreg.synchronize(1)))
    (kernel,) = device_events(p)
    assert kernel.device_index == 1


def test_kernels_on_different_streams_land_on_different_rows():
    d = torch.randn(8, 8, device="openreg")
    side = torch.openreg.Stream()
    side.wait_stream(torch.openreg.current_stream())  # d was made on the default stream

    def run():
        torch.cumsum(d, 0)
        with torch.openreg.stream(side):
            torch.cumprod(d, 0)

    p, _ = profiled(run)
    (on_default,) = device_events(p, "aten::cumsum")
    (on_side,) = device_events(p, "aten::cumprod")
    assert on_default.device_resource_id != on_side.device_resource_id


def test_a_fresh_result_is_adopted_without_a_staging_copy():
    # nonzero's CPU kernel allocates its result while the call redirects CPU
    # allocations to device memory (OpenRegCpuKernelCall.h): the result is adopted,
    # so the call issues no host-to-device copy and its kernel is all its
    # device time.
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    d = x.to("openreg")
    p, y = profiled(lambda: torch.nonzero(d))
    assert_close(y.cpu(), torch.nonzero(x))

    assert device_events(p, "Memcpy") == []
    (kernel,) = device_events(p, "aten::nonzero")
    op = linked_op(p, kernel)
    assert op.name == "aten::nonzero"
    assert op.device_time_total == pytest.approx(elapsed([kernel]))
    assert op.device_time_total <= op.time_range.elapsed_us()


# -- copies -------------------------------------------------------------------------


def test_copies_to_from_and_between_devices_are_memcpy_events():
    x = torch.randn(64, 32)

    def run():
        d0 = x.to("openreg:0")
        d1 = d0.to("openreg:1")
        return d1.cpu()

    p, back = profiled(run)
    assert_close(back, x)
    copies = device_events(p, "Memcpy")
    assert [(e.name, e.device_index) for e in copies] == [
        ("Memcpy HtoD", 0),
        ("Memcpy DtoD", 1),
        ("Memcpy DtoH", 1),
    ]
    for copy in copies:
        op = linked_op(p, copy)
        assert op.name == "aten::_copy_from"
        assert op.device_time_total == pytest.approx(elapsed(linked_to(p, op)))
        assert op.device_time_total >= copy.time_range.elapsed_us() > 0


@pytest.mark.exclusive  # timed against a 50 ms stream sleep
def test_async_copy_is_timed_when_its_stream_runs_it():
    pinned = torch.randn(256, 256).pin_memory()

    def run():
        torch.openreg._sleep(50)  # the copy queues behind 50 ms of stream work
        d = pinned.to("openreg", non_blocking=True)
        torch.openreg.synchronize()
        return d

    p, d = profiled(run)
    assert_close(d.cpu(), pinned)
    (copy,) = device_events(p, "Memcpy")
    assert copy.name == "Memcpy HtoD"
    op = linked_op(p, copy)
    # The call returned at once; the bytes moved after the sleep, on the stream.
    assert op.time_range.end < copy.time_range.start
    assert copy.time_range.start - op.time_range.start >= 40_000


def test_trace_of_a_copy_split_over_threads_counts_every_byte_once(tmp_path):
    # orMemcpy runs once per intra-op thread's share of a large copy; each share
    # carries the copy's correlation id, whichever thread moved it.
    x = torch.randn(1024, 1024)  # 4 MiB: more than one share when threads allow
    p, d = profiled(lambda: x.to("openreg"))
    assert_close(d.cpu(), x)
    shares = device_events(p, "Memcpy")
    assert shares and {e.name for e in shares} == {"Memcpy HtoD"}
    (op,) = {linked_op(p, e).id for e in shares}

    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    memcpys = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    assert sum(e["args"]["bytes"] for e in memcpys) == x.numel() * x.element_size()
    assert {e["args"]["correlation"] for e in memcpys} == {op}


# -- chrome trace -------------------------------------------------------------------


def test_chrome_trace_shows_openreg_kernels_and_copies_under_their_device(tmp_path):
    x = torch.randn(16, 16)
    p, _ = profiled(lambda: torch.cumsum(x.to("openreg"), 0).cpu())
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]

    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
    shown = [(e["cat"], e["name"]) for e in device if e["cat"] == "gpu_memcpy" or e["name"].startswith("aten::cumsum")]
    assert shown == [
        ("gpu_memcpy", "Memcpy HtoD"),
        ("kernel", "aten::cumsum"),
        ("gpu_memcpy", "Memcpy DtoH"),
    ]
    assert {e["pid"] for e in device} == {0}
    (kernel,) = [e for e in device if e["name"] == "aten::cumsum"]
    assert kernel["args"]["route"] == "structured_on_cpu_aliases"
    # Each device event names the CPU op it belongs to by correlation id.
    cpu_ops_by_id = {e["args"]["External id"]: e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert {cpu_ops_by_id[e["args"]["correlation"]] for e in device} == {"aten::_copy_from", "aten::cumsum"}
    labels = [e for e in events if e.get("ph") == "M" and e.get("name") == "process_labels" and e["pid"] == 0]
    assert labels and labels[0]["args"]["labels"] == "openreg:0"


# -- what is recorded, and when -----------------------------------------------------


def test_activity_filter_records_only_the_kinds_asked_for():
    d = torch.randn(8, 8, device="openreg")
    with profile(activities=[ProfilerActivity.CPU, {ProfilerActivity.PrivateUse1: ["GPU_MEMCPY"]}]) as p:
        torch.cumsum(d, 0).cpu()
    assert [e.name for e in device_events(p)] == ["Memcpy DtoH"]


def test_device_only_profile_records_unlinked_device_events():
    d = torch.randn(8, 8, device="openreg")
    p, _ = profiled(lambda: torch.cumsum(d, 0).cpu(), activities=[ProfilerActivity.PrivateUse1])
    assert all(e.device_type == DeviceType.PrivateUse1 and e.linked_correlation_id == 0 for e in p.events())
    names = [e.name for e in p.events()]
    assert "aten::cumsum" in names and names[-1] == "Memcpy DtoH"


def test_nothing_is_recorded_outside_a_device_profile():
    d = torch.randn(8, 8, device="openreg")
    with profile(activities=DEVICE_ACTIVITIES):
        assert torch_openreg._C._profiler_is_recording()
        torch.cumsum(d, 0)
        torch.openreg.synchronize()  # a queued kernel is recorded when it runs
        assert torch_openreg._C._profiler_buffered_activities() == 1
    # Off again: the instrumentation is back to its one atomic load.
    assert not torch_openreg._C._profiler_is_recording()
    torch.cumsum(d, 0).cpu()
    assert torch_openreg._C._profiler_buffered_activities() == 0

    p, _ = profiled(lambda: torch.cumsum(d, 0).cpu(), activities=[ProfilerActivity.CPU])
    assert not torch_openreg._C._profiler_is_recording()
    assert device_events(p) == []
    assert cpu_ops(p, "aten::cumsum")[0].device_time_total == 0


def test_device_profile_works_after_a_cpu_only_profile_initialised_kineto():
    # torch hands openreg's profiler to Kineto only at the first device profile; by
    # then a CPU-only profile may have initialised Kineto. A fresh process, so that
    # no earlier test has registered it already.
    code = (
        "import torch\n"
        "from torch.profiler import profile, ProfilerActivity as A\n"
        "d = torch.randn(8, 8, device='openreg')\n"
        "with profile(activities=[A.CPU]):\n"
        "    torch.cumsum(d, 0)\n"
        "with profile(activities=[A.CPU, A.PrivateUse1]) as p:\n"
        "    torch.cumsum(d, 0).cpu()\n"
        "print(sorted(e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['Memcpy DtoH', 'aten::cumsum']"


def test_consecutive_profiles_each_see_only_their_own_activity():
    d = torch.randn(8, 8, device="openreg")
    first, _ = profiled(lambda: torch.cumsum(d, 0))
    second, _ = profiled(lambda: torch.cumprod(d, 0))
    assert [e.name[:12] for e in device_events(first)] == ["aten::cumsum"]
    assert [e.name[:13] for e in device_events(second)] == ["aten::cumprod"]


# -- torch.autograd.profiler.profile(use_device="openreg") --------------------------


@pytest.mark.exclusive  # timed against a 50 ms stream sleep
def test_autograd_profiler_use_device_times_ops_with_openreg_events():
    # Without use_kineto, torch times each op between two events recorded on the
    # current stream (ProfilerStubs): device time, not time the host waited.
    d = torch.randn(64, 64, device="openreg")
    with torch.autograd.profiler.profile(use_device="openreg") as p:
        y = torch.cumsum(d, 0)
        torch.openreg._sleep(50)
        back = y.cpu()
    assert_close(back, torch.cumsum(d.cpu(), 0))
    ops = {e.key: e for e in p.key_averages()}
    assert ops["aten::cumsum"].device_time_total > 0
    copy = ops["aten::_copy_from"]
    assert copy.cpu_time_total >= 40_000  # the host waited for the sleep
    assert 0 < copy.device_time_total < 40_000  # the device was busy sleeping, not copying


def test_autograd_profiler_use_device_with_kineto_records_device_events():
    d = torch.randn(64, 64, device="openreg")
    with torch.autograd.profiler.profile(use_device="openreg", use_kineto=True) as p:
        torch.cumsum(d, 0).cpu()
    device = [e.name for e in p.function_events if e.device_type == DeviceType.PrivateUse1]
    assert "aten::cumsum" in device and device[-1] == "Memcpy DtoH"
    ops = {e.key: e for e in p.key_averages()}
    assert ops["aten::cumsum"].device_time_total > 0


def test_a_converting_copy_is_one_copy_call():
    """A copy with an openreg side reaches _copy_from, which runs CPU's copy
    kernel itself: the profiler sees the caller's copy_ and _copy_from, not
    a second copy_ inside (a CUDA copy is one copy_ too)."""
    x = torch.randn(4, 4, device="openreg")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x.to(torch.float64)
        x.t().contiguous()
        x.t().cpu()
    names = [e.name for e in prof.events()]
    assert names.count("aten::copy_") == 3
    assert names.count("aten::_copy_from") == 3

