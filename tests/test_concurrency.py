"""Threads: eight threads run mixed operators on both devices, on their own
streams and on the default streams, for a few seconds; every result equals
CPU's, nothing crashes, and afterwards the allocator holds no tensor memory
beyond what it held before."""

import gc
import random
import threading
import time

import pytest
import torch
from torch.testing import assert_close

MODES = ("trace", "queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

THREADS = 8
SECONDS = 3.0


def _ops(rng: random.Random, dev: str, other: str):
    """One step of work: returns (name, cpu result, device result)."""
    n = rng.choice([1, 7, 64, 257, 4099])
    x = torch.randn(n, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    d = x.to(dev)
    kind = rng.randrange(10)
    if kind == 0:  # structured, broadcasting, type promotion
        i = torch.arange(n, dtype=torch.int32)
        return "add_mul", (x * 3 - i) / 2, (d * 3 - i.to(dev)) / 2
    if kind == 1:  # reductions over dims, on a transposed view
        m = torch.randn(n % 13 + 1, 6, generator=torch.Generator().manual_seed(n)).T
        e = m.to(dev)
        return "reductions", torch.cat([m.sum(dim=1), m.amax(dim=0), m.prod(dim=1)]), torch.cat(
            [e.sum(dim=1), e.amax(dim=0), e.prod(dim=1)])
    if kind == 2:  # CPU fallback, fresh result
        m = torch.randn(8, 8, generator=torch.Generator().manual_seed(n))
        return "matmul", (m @ m).abs(), (m.to(dev) @ m.to(dev)).abs()
    if kind == 3:  # in place through a non-contiguous view
        c, e = x.clone(), d.clone()
        c[::2].mul_(-1)
        e[::2].mul_(-1)
        return "in_place_view", c, e
    if kind == 4:  # copies between the devices
        return "cross_device", x.exp(), d.to(other).exp().to(dev)
    if kind == 5:  # non-blocking copy from pinned memory on the current stream
        pinned = x.pin_memory()
        out = torch.empty(n, device=dev)
        out.copy_(pinned, non_blocking=True)
        return "pinned_copy", x.sin(), out.sin()
    if kind == 6:  # indexing with device indices
        index = torch.randint(0, n, (5,), generator=torch.Generator().manual_seed(n))
        return "index_select", x.index_select(0, index), d.index_select(0, index.to(dev))
    if kind == 7:  # out= with a resize
        out = torch.empty(0, device=dev)
        torch.maximum(d, d.flip(0), out=out)
        return "out_resize", torch.maximum(x, x.flip(0)), out
    if kind == 8:  # .item() waits for the stream
        return "item", torch.tensor(x.sum().item()), torch.tensor(d.sum().item(), device=dev)
    # record_stream: the block stays in use until the other stream's work is done
    side = torch.openreg.Stream(device=torch.device(dev).index)
    with torch.openreg.stream(side):
        y = d * 2
    y.record_stream(side)
    torch.openreg.current_stream(torch.device(dev).index).wait_stream(side)
    return "record_stream", x * 2, y


def test_eight_threads_on_both_devices_with_streams_match_cpu():
    assert torch.openreg.device_count() >= 2
    for i in range(2):
        torch.openreg.synchronize(i)
    baseline = [torch.openreg.memory_allocated(i) for i in range(2)]
    errors: list[BaseException] = []
    counts = [0] * THREADS
    deadline = time.monotonic() + SECONDS

    def work(index: int) -> None:
        rng = random.Random(index)
        device = index % 2
        dev, other = f"openreg:{device}", f"openreg:{1 - device}"
        # Half the threads run on a stream of their own, the others switch
        # between their device's default stream and a fresh one each step.
        own = torch.openreg.Stream(device=device, priority=-(index % 4 == 1))
        try:
            torch.openreg.set_device(device)
            while time.monotonic() < deadline:
                s = own if index < THREADS // 2 else rng.choice([torch.openreg.default_stream(device),
                                                                   torch.openreg.Stream(device=device)])
                with torch.openreg.stream(s):
                    name, expected, got = _ops(rng, dev, other)
                    assert got.device == torch.device(dev), name
                    assert_close(got.cpu(), expected, msg=lambda m: f"{name}: {m}")
                counts[index] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    # The trace would print every call of every thread: the test is about the
    # threads, not the trace, and the output would dominate its time.
    with torch.openreg.dispatch_trace(False):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=SECONDS + 120)
        elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in threads), "a thread hangs"
    assert errors == [], errors[0]
    assert all(c > 0 for c in counts), counts
    print(f"{THREADS} threads, {sum(counts)} steps {counts} in {elapsed:.1f} s")

    for i in range(2):
        torch.openreg.synchronize(i)
    gc.collect()
    assert [torch.openreg.memory_allocated(i) for i in range(2)] == baseline
    for i in range(2):
        stats = torch.openreg.memory_stats(i)
        assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"] == baseline[i]
        assert stats["allocated_bytes.all.current"] <= stats["reserved_bytes.all.current"]
        assert stats["allocation.all.current"] == stats["active.all.current"]
    assert_close((torch.ones(4, device="openreg:1") * 3).cpu(), torch.full((4,), 3.0))


def test_threads_sharing_one_stream_and_events_across_devices():
    # Producers on openreg:0 and openreg:1 record events; consumers on the
    # other device wait on them and read the result after a cross-device copy.
    errors: list[BaseException] = []
    rounds = 40

    def pair(device: int) -> None:
        try:
            produce = torch.openreg.Stream(device=device)
            consume = torch.openreg.Stream(device=1 - device)
            for r in range(rounds):
                x = torch.full((1000,), float(r))
                with torch.openreg.stream(produce):
                    d = x.pin_memory().to(f"openreg:{device}", non_blocking=True) + 1
                    done = torch.openreg.Event()
                    done.record(produce)
                with torch.openreg.stream(consume):
                    done.wait(consume)
                    e = d.to(f"openreg:{1 - device}") * 2
                    assert_close(e.cpu(), (x + 1) * 2)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    with torch.openreg.dispatch_trace(False):  # see above
        threads = [threading.Thread(target=pair, args=(i % 2,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == [], errors[0]


@pytest.mark.parametrize("device", [0, 1])
def test_empty_cache_while_other_threads_allocate(device):
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                t = torch.empty(rng.choice([100, 1 << 20, 3 << 20]), device=f"openreg:{device}")
                t.fill_(seed)
                assert t[-1].item() == seed
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    baseline = torch.openreg.memory_allocated(device)
    with torch.openreg.dispatch_trace(False):  # see above
        threads = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            torch.openreg.empty_cache()
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert errors == [], errors[0]
    gc.collect()
    assert torch.openreg.memory_allocated(device) == baseline
