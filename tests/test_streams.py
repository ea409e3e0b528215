"""Streams and events: torch.openreg.Stream/Event, torch.Stream/torch.Event, ordering."""

import threading
import time

import pytest
import torch
from torch.testing import assert_close

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

# The tests queue work behind a sleeping stream and check what the host sees
# before it ends: they need the machine to themselves (conftest.py).
pytestmark = pytest.mark.exclusive

N = 1 << 20


@pytest.fixture(autouse=True)
def _default_streams_afterwards():
    yield
    for i in range(torch.openreg.device_count()):
        torch.openreg.synchronize(i)
        torch.openreg.set_stream(torch.openreg.default_stream(i))


# -- stream objects -----------------------------------------------------------------


def test_default_stream_is_current_and_has_id_zero():
    s = torch.openreg.current_stream()
    assert isinstance(s, torch.openreg.Stream) and isinstance(s, torch.Stream)
    assert s.stream_id == 0 and s == torch.openreg.default_stream()
    assert s.device == torch.device("openreg:0")


def test_new_streams_are_distinct_and_on_the_requested_device():
    a, b = torch.openreg.Stream(), torch.openreg.Stream(device=1)
    assert a.device == torch.device("openreg:0") and b.device == torch.device("openreg:1")
    assert a != torch.openreg.default_stream()
    generic = torch.Stream(device="openreg:1")
    assert generic.device == torch.device("openreg:1") and generic.stream_id != 0


def test_priorities_like_cuda():
    least, greatest = torch.openreg.Stream.priority_range()
    assert (least, greatest) == (0, -1)
    assert torch.openreg.Stream(priority=-1).priority == -1
    assert torch.openreg.Stream(priority=-7).priority == -1  # clamped
    assert torch.openreg.Stream().priority == 0
    assert torch.openreg.default_stream().priority == 0


def test_stream_context_sets_and_restores_current_stream_and_device():
    s = torch.openreg.Stream(device=1)
    with torch.openreg.stream(s):
        assert torch.openreg.current_device() == 1
        assert torch.openreg.current_stream() == s
        assert torch.accelerator.current_stream() == s
    assert torch.openreg.current_device() == 0
    assert torch.openreg.current_stream(1).stream_id == 0
    assert torch.openreg.current_stream(0).stream_id == 0
    with torch.openreg.stream(None):
        assert torch.openreg.current_stream().stream_id == 0


def test_set_stream_through_torch_accelerator():
    s = torch.openreg.Stream()
    torch.accelerator.set_stream(s)
    assert torch.openreg.current_stream() == s
    torch.openreg.set_stream(torch.openreg.default_stream())
    assert torch.openreg.current_stream().stream_id == 0


def test_current_stream_is_per_thread():
    s = torch.openreg.Stream()
    torch.openreg.set_stream(s)
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.openreg.current_stream().stream_id))
    t.start()
    t.join()
    assert seen == [0] and torch.openreg.current_stream() == s


def test_set_stream_rejects_other_devices():
    with pytest.raises(ValueError, match="expected an openreg stream"):
        torch.openreg.set_stream(torch.Stream(device="cpu"))


# -- asynchrony and ordering --------------------------------------------------------


def test_query_and_synchronize_see_queued_work():
    s = torch.openreg.Stream()
    with torch.openreg.stream(s):
        torch.openreg._sleep(200)
    assert not s.query()
    s.synchronize()
    assert s.query()


def test_non_blocking_host_to_device_copy_returns_before_the_stream_runs_it():
    src = torch.arange(N, dtype=torch.float32).pin_memory()
    dst = torch.empty(N, device="openreg")
    s = torch.openreg.Stream()
    s.wait_stream(torch.openreg.current_stream())  # dst was allocated on the default stream
    with torch.openreg.stream(s):
        torch.openreg._sleep(300)
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        returned_after = time.perf_counter() - start
        assert not s.query()
        doubled = dst * 2  # a kernel on the stream runs after the copy
    assert returned_after < 0.2
    s.synchronize()  # .cpu() below reads on the default stream, as on CUDA
    assert_close(doubled.cpu(), src * 2)


def test_non_blocking_device_to_host_copy_into_pinned_memory_completes_on_sync():
    x = torch.randn(N, device="openreg")
    expected = x.cpu()
    out = torch.empty(N).pin_memory()
    torch.openreg._sleep(200)
    out.copy_(x, non_blocking=True)
    event = torch.openreg.Event()
    event.record()
    assert not event.query()
    event.synchronize()
    assert event.query()
    assert_close(out, expected)


def test_non_blocking_copy_from_pageable_memory_is_synchronous():
    src = torch.arange(16.0)  # not pinned: nothing may read it after the call returns
    torch.openreg._sleep(150)
    dst = src.to("openreg", non_blocking=True)
    src.fill_(-1)
    assert_close(dst.cpu(), torch.arange(16.0))


def test_wait_stream_orders_work_across_streams():
    producer, consumer = torch.openreg.Stream(), torch.openreg.Stream()
    src = torch.arange(N, dtype=torch.float32).pin_memory()
    dst = torch.empty(N, device="openreg")
    producer.wait_stream(torch.openreg.current_stream())  # dst was allocated on the default stream
    with torch.openreg.stream(producer):
        torch.openreg._sleep(200)
        dst.copy_(src, non_blocking=True)
    consumer.wait_stream(producer)
    with torch.openreg.stream(consumer):
        result = dst + 1
    consumer.synchronize()  # .cpu() below reads on the default stream
    assert_close(result.cpu(), src + 1)


def test_event_wait_blocks_only_the_waiting_stream():
    a, b = torch.openreg.Stream(), torch.openreg.Stream()
    with torch.openreg.stream(a):
        torch.openreg._sleep(200)
    e = torch.openreg.Event()
    e.record(a)
    e.wait(b)
    assert not b.query()  # b waits for a
    assert torch.openreg.default_stream().query()  # the default stream does not
    b.synchronize()
    assert a.query() and e.query()


def test_a_kernel_waits_for_its_own_stream_only():
    # While any stream has queued work, a kernel looks its own stream up; it
    # must not wait for another stream's work (nor skip its own).
    busy, own = torch.openreg.Stream(), torch.openreg.Stream()
    with torch.openreg.stream(busy):
        torch.openreg._sleep(400)
    src = torch.arange(N, dtype=torch.float32).pin_memory()
    dst = torch.empty(N, device="openreg")
    own.wait_stream(torch.openreg.current_stream())  # dst was allocated on the default stream
    start = time.perf_counter()
    with torch.openreg.stream(own):
        dst.copy_(src, non_blocking=True)
        doubled = dst * 2
    x = torch.ones(4, device="openreg") + 1  # on the idle default stream
    elapsed = time.perf_counter() - start
    assert not busy.query()
    assert elapsed < 0.3
    own.synchronize()  # .cpu() below reads on the default stream
    assert_close(doubled.cpu(), src * 2)
    assert_close(x.cpu(), torch.full((4,), 2.0))


def test_elapsed_time_with_timing_events():
    start, end = torch.openreg.Event(enable_timing=True), torch.openreg.Event(enable_timing=True)
    start.record()
    torch.openreg._sleep(50)
    end.record()
    end.synchronize()
    assert 45 <= start.elapsed_time(end) < 2000


def test_elapsed_time_needs_timing_and_completion():
    plain = torch.openreg.Event()
    timed = torch.openreg.Event(enable_timing=True)
    plain.record()
    timed.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        plain.elapsed_time(timed)
    late = torch.openreg.Event(enable_timing=True)
    torch.openreg._sleep(200)
    late.record()
    with pytest.raises(RuntimeError, match="completed"):
        timed.elapsed_time(late)


def test_unrecorded_event_is_complete_and_waiting_on_it_is_a_no_op():
    e = torch.openreg.Event()
    assert e.query()
    e.synchronize()
    s = torch.openreg.Stream()
    s.wait_event(e)
    assert s.query()


def test_torch_event_and_stream_are_device_generic():
    s = torch.Stream(device="openreg")
    e = torch.Event(device="openreg", enable_timing=True)
    e.record(s)
    e.synchronize()
    assert e.query() and s.query()


def test_interprocess_events_are_refused():
    with pytest.raises(NotImplementedError, match="interprocess=False"):
        torch.openreg.Event(interprocess=True)


def test_synchronize_waits_for_every_stream_of_the_device():
    streams = [torch.openreg.Stream() for _ in range(3)]
    for s in streams:
        with torch.openreg.stream(s):
            torch.openreg._sleep(100)
    torch.accelerator.synchronize()
    assert all(s.query() for s in streams)


def test_item_waits_for_the_current_stream():
    src = torch.tensor([7.0]).pin_memory()
    dst = torch.zeros(1, device="openreg")
    torch.openreg._sleep(150)
    dst.copy_(src, non_blocking=True)
    assert dst.item() == 7.0


def test_pinned_buffer_of_a_pending_copy_is_not_reused():
    dst = torch.empty(N, device="openreg")
    src = torch.ones(N).pin_memory()
    address = src.data_ptr()
    torch.openreg._sleep(300)
    dst.copy_(src, non_blocking=True)
    del src
    other = torch.empty(N, pin_memory=True)
    assert other.data_ptr() != address
    torch.openreg.synchronize()
    assert_close(dst.cpu(), torch.ones(N))


# -- threads ------------------------------------------------------------------------


def test_threads_with_their_own_streams_get_correct_results():
    errors = []

    def work(seed):
        try:
            device = seed % 2
            s = torch.openreg.Stream(device=device)
            g = torch.Generator().manual_seed(seed)
            with torch.openreg.stream(s):
                for _ in range(20):
                    x = torch.randn(257, generator=g)
                    pinned = x.pin_memory()
                    d = torch.empty(257, device=f"openreg:{device}")
                    d.copy_(pinned, non_blocking=True)
                    y = (d * 3 - 1).sum()
                    assert_close(y.cpu(), (x * 3 - 1).sum())
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_stream_and_event_agree_on_what_has_completed():
    # An event is a position in its stream's work: seen complete, the stream
    # has done that work; a stream seen idle has completed its events. (An
    # event completed by a task of its own, a moment before the stream counted
    # that task done, would let b.synchronize() return under load with
    # a.query() still False.)
    a, b = torch.openreg.Stream(), torch.openreg.Stream()
    for _ in range(200):
        with torch.openreg.stream(a):
            torch.openreg._sleep(0.05)
        e = torch.openreg.Event()
        e.record(a)
        e.wait(b)
        b.synchronize()
        assert e.query() and a.query()
        with torch.openreg.stream(a):
            torch.openreg._sleep(0.05)
        e.record(a)
        while not a.query():
            pass
        assert e.query()
