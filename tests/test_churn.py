"""Allocation churn: a million allocate/free cycles of varied sizes on both
devices leave the caching allocator where it started (memory_allocated at its
baseline), keep its reserve bounded, and do not grow the process.

Bounds (measured on the 2-core CI machine: about 4 s for the million cycles,
peak reserve 130-200 MiB per device, RSS back within 3 MiB after empty_cache):
- memory_reserved never exceeds RESERVE_FACTOR x the peak of memory_allocated
  plus one 20 MiB large-pool segment per live slot (the allocator's
  fragmentation allowance);
- after empty_cache the process RSS (/proc/self/statm) is at most RSS_SLACK above
  what it was before the churn: device pages are given back to the host
  (orFree's madvise) and the allocator's bookkeeping does not grow.
"""

import gc
import os
import random
import time

import torch

MODES = ("trace",)  # the extra CI passes that run this file (tests/conftest.py)

CYCLES = 1_000_000
SLOTS = 16  # tensors alive at once, so blocks are split and merged, not only reused
RESERVE_FACTOR = 2
MiB = 1 << 20
# Under AddressSanitizer (docs/integration/testing.md, "Sanitizers") freed heap memory waits
# in ASan's quarantine (256 MiB by default) before it is reused, on purpose.
UNDER_ASAN = any("libasan" in line for line in open("/proc/self/maps"))
RSS_SLACK = (32 + 256 * UNDER_ASAN) * MiB


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sizes(rng: random.Random, n: int) -> list[int]:
    """Log-uniform from 1 byte to 4 MiB (both pools, every rounding class),
    with one in a thousand from 10 to 40 MiB (segments of their own)."""
    return [rng.randrange(10 * MiB, 40 * MiB) if rng.random() < 0.001 else int(2 ** rng.uniform(0, 22))
            for _ in range(n)]


def test_a_million_allocations_return_to_baseline_with_bounded_reserve_and_rss():
    rng = random.Random(0)
    plan = sizes(rng, CYCLES)
    slot_of = [rng.randrange(SLOTS) for _ in range(CYCLES)]
    devices = ["openreg:0", "openreg:1"]
    for d in range(2):
        torch.openreg.synchronize(d)
    torch.openreg.empty_cache()
    gc.collect()
    baseline = [torch.openreg.memory_allocated(d) for d in range(2)]
    ooms = [torch.openreg.memory_stats(d)["num_ooms"] for d in range(2)]
    for d in range(2):
        torch.openreg.reset_peak_memory_stats(d)
    rss_before = rss()
    live = [None] * SLOTS
    empty, uint8 = torch.empty, torch.uint8
    started = time.perf_counter()
    # A million trace lines would cost more than the churn itself; the trace
    # has its own tests.
    with torch.openreg.dispatch_trace(False):
        for i in range(CYCLES):
            j = slot_of[i]
            live[j] = None  # free first, so the freed block can serve the request
            t = empty(plan[i], dtype=uint8, device=devices[j & 1])
            if i & 255 == 0:
                t.fill_(i & 127)  # touch the pages now and then, so RSS sees device memory
                assert t[-1].item() == i & 127
            live[j] = t
        del t
    elapsed = time.perf_counter() - started
    rss_during = rss()
    live = None
    gc.collect()

    assert [torch.openreg.memory_allocated(d) for d in range(2)] == baseline
    peaks = []
    for d in range(2):
        stats = torch.openreg.memory_stats(d)
        assert stats["allocation.all.current"] == stats["active.all.current"]
        assert stats["num_ooms"] == ooms[d]
        peak_allocated = torch.openreg.max_memory_allocated(d)
        peak_reserved = torch.openreg.max_memory_reserved(d)
        peaks.append(peak_reserved)
        assert peak_reserved <= RESERVE_FACTOR * peak_allocated + SLOTS * 20 * MiB, (d, peak_allocated, peak_reserved)
    torch.openreg.empty_cache()
    for d in range(2):
        if baseline[d] == 0:  # nothing else alive: every segment can go back
            assert torch.openreg.memory_reserved(d) == 0
    rss_after = rss()
    print(
        f"{CYCLES} cycles in {elapsed:.1f} s ({elapsed / CYCLES * 1e6:.2f} us each); "
        f"RSS before {rss_before / MiB:.0f} MiB, during {rss_during / MiB:.0f} MiB, after empty_cache "
        f"{rss_after / MiB:.0f} MiB; peak reserved {[p // MiB for p in peaks]} MiB"
    )
    assert rss_after <= rss_before + RSS_SLACK, (rss_before, rss_after)
    assert rss_during <= rss_before + sum(peaks) + RSS_SLACK, (rss_before, rss_during, peaks)


def test_small_allocations_are_served_from_the_cache_without_new_segments():
    # A hundred thousand same-stream cycles through one small segment: no device
    # allocation after the first, and the pool ends where it began.
    torch.openreg.empty_cache()
    before = torch.openreg.memory_stats(0)
    with torch.openreg.dispatch_trace(False):  # see above
        for i in range(100_000):
            torch.empty(1 + i % 4096, dtype=torch.uint8, device="openreg:0")
    after = torch.openreg.memory_stats(0)
    assert after["num_device_alloc"] - before["num_device_alloc"] <= 1
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["segment.all.current"] <= before["segment.all.current"] + 1
