"""torch.openreg.MemPool and use_mem_pool: private pools of the caching allocator,
as torch.cuda's."""

import gc
import threading

import pytest
import torch

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

MiB = 1 << 20


def segment_of(t: torch.Tensor, segments: list[dict]) -> dict | None:
    found = [s for s in segments if s["address"] <= t.data_ptr() < s["address"] + s["total_size"]]
    return found[0] if found else None


def test_allocations_inside_use_mem_pool_come_from_the_pool_s_own_segments():
    pool = torch.openreg.MemPool()
    assert pool.id[0] == 0 and pool.id[1] > 0 and pool.device == torch.device("openreg", 0)
    outside = torch.empty(1000, device="openreg")
    with torch.openreg.use_mem_pool(pool):
        inside = torch.empty(1000, device="openreg")
        large = torch.empty(3 * MiB, dtype=torch.uint8, device="openreg")
        on_other_device = torch.empty(1000, device="openreg:1")
    after = torch.empty(1000, device="openreg")
    mine = pool.snapshot()
    assert segment_of(inside, mine) is not None and segment_of(large, mine) is not None
    assert all(segment_of(t, mine) is None for t in (outside, after, on_other_device))
    assert all(s["segment_pool_id"] == pool.id for s in mine)
    assert torch.openreg.memory_snapshot(pool.id) == mine


def test_a_pool_s_freed_blocks_are_reused_only_inside_it():
    pool = torch.openreg.MemPool()
    with torch.openreg.use_mem_pool(pool):
        t = torch.empty(4096, device="openreg")
    address = t.data_ptr()
    del t
    outside = torch.empty(4096, device="openreg")
    assert outside.data_ptr() != address  # the default pool does not take the pool's block
    with torch.openreg.use_mem_pool(pool):
        again = torch.empty(4096, device="openreg")
    assert again.data_ptr() == address


def test_use_count_counts_the_pool_and_its_active_blocks():
    pool = torch.openreg.MemPool()
    assert pool.use_count() == 1
    with torch.openreg.use_mem_pool(pool):
        assert pool.use_count() == 2
        with torch.openreg.use_mem_pool(pool):
            assert pool.use_count() == 3
        assert pool.use_count() == 2
    assert pool.use_count() == 1


def test_nested_pools_route_to_the_innermost_and_back():
    outer, inner = torch.openreg.MemPool(), torch.openreg.MemPool()
    with torch.openreg.use_mem_pool(outer):
        a = torch.empty(100, device="openreg")
        with torch.openreg.use_mem_pool(inner):
            b = torch.empty(100, device="openreg")
        c = torch.empty(100, device="openreg")
    assert segment_of(a, outer.snapshot()) and segment_of(c, outer.snapshot())
    assert segment_of(b, inner.snapshot()) and not segment_of(b, outer.snapshot())


def test_other_threads_keep_allocating_from_the_default_pools():
    pool = torch.openreg.MemPool()
    results = {}
    with torch.openreg.use_mem_pool(pool):
        mine = torch.empty(100, device="openreg")
        worker = threading.Thread(target=lambda: results.setdefault("t", torch.empty(100, device="openreg")))
        worker.start()
        worker.join()
    assert segment_of(mine, pool.snapshot()) is not None
    assert segment_of(results["t"], pool.snapshot()) is None


def pool_holding_30_mib_on_device_1():
    """(reserved bytes of openreg:1 before, a pool of openreg:1, a 30 MiB tensor of it)."""
    torch.openreg.synchronize(1)
    torch.openreg.empty_cache()
    baseline = torch.openreg.memory_reserved(1)
    with torch.openreg.device(1):
        pool = torch.openreg.MemPool()
        with torch.openreg.use_mem_pool(pool):
            t = torch.ones(30 * MiB, dtype=torch.uint8, device="openreg:1")
    return baseline, pool, t


def test_the_pool_keeps_its_cache_until_deleted_then_gives_it_back():
    baseline, pool, t = pool_holding_30_mib_on_device_1()
    del t
    torch.openreg.empty_cache()
    assert torch.openreg.memory_reserved(1) == baseline + 30 * MiB  # kept for the pool
    assert len(pool.snapshot()) == 1
    del pool
    gc.collect()
    assert torch.openreg.memory_reserved(1) == baseline


def test_blocks_alive_when_the_pool_goes_are_given_back_once_freed():
    baseline, pool, t = pool_holding_30_mib_on_device_1()
    del pool
    gc.collect()
    assert t.sum().item() == 30 * MiB  # still usable
    del t
    torch.openreg.empty_cache()
    assert torch.openreg.memory_reserved(1) == baseline


def test_releasing_a_pool_leaves_the_default_pools_cache():
    torch.openreg.synchronize(1)
    torch.openreg.empty_cache()
    cached = torch.empty(30 * MiB, dtype=torch.uint8, device="openreg:1")
    del cached  # 30 MiB cached in the default pool
    reserved = torch.openreg.memory_reserved(1)
    with torch.openreg.device(1):
        pool = torch.openreg.MemPool()
        with torch.openreg.use_mem_pool(pool):
            t = torch.empty(1000, device="openreg:1")
    del t, pool
    gc.collect()
    assert torch.openreg.memory_reserved(1) == reserved  # the pool's segment went, the default cache stayed


def limited_to(extra: int, device: int = 1) -> float:
    """Sets openreg:`device`'s memory fraction to what it reserves now plus `extra`
    bytes; returns the fraction to restore."""
    _, total = torch.openreg.mem_get_info(device)
    before = torch.openreg.get_per_process_memory_fraction(device)
    torch.openreg.set_per_process_memory_fraction((torch.openreg.memory_reserved(device) + extra) / total, device)
    return before


@pytest.mark.parametrize("use_on_oom", [True, False])
def test_use_on_oom_lets_an_allocation_that_finds_no_memory_take_the_pool_s_cached_block(use_on_oom):
    torch.openreg.synchronize(1)
    torch.openreg.empty_cache()
    with torch.openreg.device(1):
        pool = torch.openreg.MemPool(use_on_oom=use_on_oom)
        with torch.openreg.use_mem_pool(pool):
            t = torch.empty(30 * MiB, dtype=torch.uint8, device="openreg:1")
    address = t.data_ptr()
    del t  # cached in the pool
    before = limited_to(10 * MiB)  # no room for another 30 MiB segment
    try:
        if use_on_oom:
            outside = torch.full((30 * MiB,), 7, dtype=torch.uint8, device="openreg:1")
            assert outside.data_ptr() == address and outside[-1].item() == 7
            del outside
        else:
            with pytest.raises(torch.OutOfMemoryError, match="openreg out of memory"):
                torch.empty(30 * MiB, dtype=torch.uint8, device="openreg:1")
    finally:
        torch.openreg.set_per_process_memory_fraction(before, 1)
    del pool
    gc.collect()


def test_no_split_gives_each_allocation_a_whole_block():
    def blocks_per_segment(pool):
        return sorted(len([b for b in s["blocks"] if b["state"] != "inactive"]) for s in pool.snapshot())

    splitting, whole = torch.openreg.MemPool(), torch.openreg.MemPool(no_split=True)
    kept = {}
    for name, pool in (("split", splitting), ("whole", whole)):
        with torch.openreg.use_mem_pool(pool):
            kept[name] = [torch.empty(1000, device="openreg") for _ in range(2)]
    assert blocks_per_segment(splitting) == [2]  # one 2 MiB segment, split
    assert blocks_per_segment(whole) == [1, 1]
    assert all(len(s["blocks"]) == 1 for s in whole.snapshot())
    first = kept["whole"][0].data_ptr()
    del kept["whole"][0]
    with torch.openreg.use_mem_pool(whole):
        small = torch.empty(10, device="openreg")
    assert small.data_ptr() == first  # the whole cached block again, not split
    assert all(len(s["blocks"]) == 1 for s in whole.snapshot())


def test_bad_uses_raise_clear_errors():
    with pytest.raises(TypeError, match=r"MemPool\(allocator=...\) takes an OpenRegPluggableAllocator, not object"):
        torch.openreg.MemPool(allocator=object())
    pool = torch.openreg.MemPool()
    with pytest.raises(ValueError, match="the pool belongs to openreg:0, not openreg:1"):
        with torch.openreg.use_mem_pool(pool, device=1):
            pass
    assert pool.use_count() == 1
