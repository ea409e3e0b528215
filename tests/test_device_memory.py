"""Device memory: CPU code cannot touch it, the caching allocator, capacity and OOM."""

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.testing import assert_close

import torch_openreg

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

MiB = 1 << 20
GiB = 1 << 30


def run_python(code, env=None, args=()):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *args, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
    )


# -- CPU code cannot dereference device memory -----------------------------------

READ_DEVICE_POINTER = """
    import ctypes, torch
    t = torch.ones(4, device="openreg:1")
    print("value", ctypes.c_float.from_address(t.data_ptr() + 8).value, flush=True)
"""


def test_host_read_of_device_memory_ends_the_process_naming_openreg_and_the_allocation():
    result = run_python(READ_DEVICE_POINTER)
    assert result.returncode == -11, result.stderr  # SIGSEGV, not a silent read
    assert "value" not in result.stdout
    assert "openreg: host code accessed device memory" in result.stderr
    # The runtime allocation is the allocator's 2 MiB segment.
    assert "8 bytes into a 2097152-byte allocation on openreg:1" in result.stderr
    assert "tensor.cpu()" in result.stderr


def test_fault_report_comes_before_faulthandler_traceback():
    result = run_python(READ_DEVICE_POINTER, args=("-X", "faulthandler"))
    assert result.returncode != 0
    report = result.stderr.find("openreg: host code accessed device memory")
    traceback = result.stderr.find("Fatal Python error: Segmentation fault")
    assert 0 <= report < traceback, result.stderr


def test_host_write_to_freed_device_memory_is_reported():
    result = run_python(
        """
        import ctypes, torch
        t = torch.ones(1 << 20, dtype=torch.uint8, device="openreg")
        address = t.data_ptr()
        del t
        torch.openreg.empty_cache()
        ctypes.c_uint8.from_address(address).value = 1
        """
    )
    assert result.returncode == -11
    assert "which is not a live allocation" in result.stderr


def test_device_pointer_is_not_host_memory_but_kernels_and_copies_work():
    x = torch.arange(10.0)
    d = x.to("openreg")
    assert torch._C._get_privateuse1_backend_name() == "openreg"
    assert_close((d * 2 + 1).cpu(), x * 2 + 1)
    assert_close(d.abs().cpu(), x)  # through the CPU fallback
    assert d[3].item() == 3.0


# -- caching allocator ------------------------------------------------------------


def test_freed_block_is_reused_without_a_new_device_allocation():
    torch.openreg.empty_cache()
    first = torch.empty(1000, device="openreg:1")
    address = first.data_ptr()
    device_allocs = torch.openreg.memory_stats(1)["num_device_alloc"]
    del first
    second = torch.empty(1000, device="openreg:1")
    assert second.data_ptr() == address
    assert torch.openreg.memory_stats(1)["num_device_alloc"] == device_allocs


def test_allocated_and_reserved_bytes_follow_tensors_and_empty_cache():
    torch.openreg.empty_cache()
    allocated = torch.openreg.memory_allocated(1)
    reserved = torch.openreg.memory_reserved(1)
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="openreg:1")
    assert torch.openreg.memory_allocated(1) == allocated + 3 * MiB
    assert torch.openreg.memory_reserved(1) == reserved + 20 * MiB  # one large-pool segment
    del t
    assert torch.openreg.memory_allocated(1) == allocated
    assert torch.openreg.memory_reserved(1) == reserved + 20 * MiB  # cached
    torch.openreg.empty_cache()
    assert torch.openreg.memory_reserved(1) == reserved


def test_small_requests_share_a_segment_and_sizes_round_to_512_bytes():
    # Read from the snapshot rather than from segment counts: memory an earlier
    # test in this process still holds (a storage sent to a child process that
    # exited without freeing it stays allocated, as with CUDA IPC) may already
    # have a small segment with room for these.
    torch.openreg.empty_cache()
    tensors = [torch.empty(n, dtype=torch.uint8, device="openreg:1") for n in (1, 513, 4096)]
    blocks = {
        block["address"]: (segment["address"], block["size"])
        for segment in torch.openreg.memory_snapshot()
        if segment["device"] == 1 and segment["segment_type"] == "small"
        for block in segment["blocks"]
    }
    found = [blocks[t.data_ptr()] for t in tensors]
    assert len({segment for segment, _ in found}) == 1
    assert [size for _, size in found] == [512, 1024, 4096]
    stats = torch.openreg.memory_stats(1)
    assert stats["requested_bytes.small_pool.current"] >= 1 + 513 + 4096
    assert stats["allocated_bytes.small_pool.current"] >= 512 + 1024 + 4096
    del tensors


def test_memory_stats_keys_match_torch_cuda():
    # Both reads see one state: a garbage collection between them (their dicts'
    # allocations can start one) would free an earlier test's tensors.
    gc.collect()
    gc.disable()
    try:
        stats = torch.openreg.memory_stats(0)
        via_accelerator = torch.accelerator.memory_stats(0)
    finally:
        gc.enable()
    for key in (
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.large_pool.current",
        "active_bytes.small_pool.allocated",
        "requested_bytes.all.freed",
        "segment.all.current",
        "num_alloc_retries",
        "num_ooms",
        "num_device_alloc",
        "num_device_free",
    ):
        assert key in stats, key
    assert stats == via_accelerator


def _summary_row(summary, label):
    """The four columns (current, peak, total allocated, total freed) of a row."""
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in\n{summary}")


def _bytes_shown(cell, exact):
    """A size cell ("8192 KiB") against the exact byte count it shows, rounded down to its unit."""
    number, unit = cell.split()
    scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
    return int(number) == exact // scale


def test_memory_summary_has_cuda_s_table_and_follows_the_allocations():
    torch.openreg.synchronize(1)
    torch.openreg.reset_peak_memory_stats(1)
    t = torch.empty(8 * MiB, dtype=torch.uint8, device="openreg:1")
    summary = torch.openreg.memory_summary(1)
    stats = torch.openreg.memory_stats(1)
    lines = summary.splitlines()
    assert {len(line) for line in lines} == {77}  # CUDA's width: 75 between the bars
    assert "PyTorch openreg memory summary, device ID 1" in lines[1]
    assert f"openreg OOMs: {stats['num_ooms']} " in lines[3]
    assert f"malloc retries: {stats['num_alloc_retries']} " in lines[3]
    # torch.cuda.memory_summary's rows, per pool unless abbreviated.
    for label in ("Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
                  "Non-releasable memory", "Allocations", "Active allocs", "GPU reserved segments",
                  "Non-releasable allocs", "Oversize allocations", "Oversize GPU segments"):
        _summary_row(summary, label)
    assert summary.count("from large pool") == summary.count("from small pool") == 9
    current, peak, allocated, _ = _summary_row(summary, "Allocated memory")
    assert stats["allocated_bytes.all.current"] >= 8 * MiB
    assert _bytes_shown(current, stats["allocated_bytes.all.current"])
    assert _bytes_shown(peak, stats["allocated_bytes.all.peak"])
    assert _bytes_shown(allocated, stats["allocated_bytes.all.allocated"])
    assert _summary_row(summary, "Allocations")[0] == str(stats["allocation.all.current"])
    del t
    after = torch.openreg.memory_summary(1, abbreviated=True)
    stats_after = torch.openreg.memory_stats(1)
    assert "from large pool" not in after
    current, peak, _, freed = _summary_row(after, "Allocated memory")
    assert stats_after["allocated_bytes.all.current"] == stats["allocated_bytes.all.current"] - 8 * MiB
    assert _bytes_shown(current, stats_after["allocated_bytes.all.current"])
    assert _bytes_shown(peak, stats["allocated_bytes.all.peak"])
    assert _bytes_shown(freed, stats_after["allocated_bytes.all.freed"])
    with pytest.raises(ValueError, match="expected an openreg device"):
        torch.openreg.memory_summary("cpu")


def test_memory_stats_as_nested_dict_and_the_deprecated_names_read_the_same_statistics():
    t = torch.empty(MiB, dtype=torch.uint8, device="openreg:1")
    flat = torch.openreg.memory_stats(1)
    nested = torch.openreg.memory_stats_as_nested_dict(1)
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"]
    assert nested["num_ooms"] == flat["num_ooms"]

    def leaves(d, prefix=""):
        for key, value in d.items():
            yield from leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [(prefix + key, value)]

    assert dict(leaves(nested)) == dict(flat)
    with pytest.warns(FutureWarning, match="memory_reserved"):
        assert torch.openreg.memory_cached(1) == torch.openreg.memory_reserved(1)
    with pytest.warns(FutureWarning, match="max_memory_reserved"):
        assert torch.openreg.max_memory_cached(1) == torch.openreg.max_memory_reserved(1)
    del t
    for reset in (torch.openreg.reset_max_memory_allocated, torch.openreg.reset_max_memory_cached):
        with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
            reset(1)
        assert torch.openreg.max_memory_allocated(1) == torch.openreg.memory_allocated(1)


def test_per_process_memory_fraction_limits_the_allocator_as_on_cuda():
    assert torch.openreg.get_per_process_memory_fraction(1) == 1.0
    capacity = torch.openreg.get_device_properties(1).total_memory
    torch.openreg.empty_cache()
    torch.openreg.set_per_process_memory_fraction(0.2, "openreg:1")
    try:
        assert torch.openreg.get_per_process_memory_fraction(1) == 0.2
        a = torch.empty(int(capacity * 0.15), dtype=torch.uint8, device="openreg:1")
        ooms = torch.openreg.memory_stats(1)["num_ooms"]
        with pytest.raises(torch.OutOfMemoryError, match=r"may reserve .* \(set_per_process_memory_fraction\(0.2\)\)"):
            torch.empty(int(capacity * 0.1), dtype=torch.uint8, device="openreg:1")
        assert torch.openreg.memory_stats(1)["num_ooms"] == ooms + 1
        del a
        b = torch.empty(int(capacity * 0.1), dtype=torch.uint8, device="openreg:1")  # the cache freed, retried
        assert torch.openreg.memory_reserved(1) <= capacity * 0.2
        del b
    finally:
        torch.openreg.set_per_process_memory_fraction(1.0, 1)
    assert torch.openreg.get_per_process_memory_fraction(0) == 1.0  # per device
    with pytest.raises(TypeError, match="must be `float`"):
        torch.openreg.set_per_process_memory_fraction(1, 1)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"Allowed range: 0~1"):
            torch.openreg.set_per_process_memory_fraction(bad, 1)


def test_peak_stats_reset():
    t = torch.empty(2 * MiB, dtype=torch.uint8, device="openreg:1")
    peak = torch.openreg.max_memory_allocated(1)
    del t
    assert torch.openreg.max_memory_allocated(1) == peak
    torch.openreg.reset_peak_memory_stats(1)
    assert torch.openreg.max_memory_allocated(1) == torch.openreg.memory_allocated(1)
    assert torch.openreg.max_memory_reserved(1) == torch.openreg.memory_reserved(1)


def test_allocations_land_on_the_guarded_device():
    before = [torch.openreg.memory_allocated(i) for i in range(2)]
    with torch.openreg.device(1):
        t = torch.empty(MiB, dtype=torch.uint8, device="openreg")
    assert t.device == torch.device("openreg:1")
    assert torch.openreg.memory_allocated(1) == before[1] + MiB
    assert torch.openreg.memory_allocated(0) == before[0]


@pytest.mark.exclusive  # the stream must still be sleeping when the block is freed
def test_record_stream_delays_reuse_until_the_stream_has_finished():
    # Start from an empty pool: a block left by an earlier test (tensors that
    # tracebacks of expected failures keep alive until a collection) changes
    # which free block best fits the allocations below.
    gc.collect()
    torch.openreg.synchronize()
    torch.openreg.empty_cache()
    # 4 MiB blocks come from the large pool, each in a segment of its own;
    # small-pool memory an earlier test still holds does not change the choice.
    s = torch.openreg.Stream()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="openreg")
    address = x.data_ptr()
    with torch.openreg.stream(s):
        torch.openreg._sleep(300)
    x.record_stream(s)
    del x
    y = torch.empty(4 * MiB, dtype=torch.uint8, device="openreg")
    assert y.data_ptr() != address  # s may still use the old block
    s.synchronize()
    z = torch.empty(4 * MiB, dtype=torch.uint8, device="openreg")
    assert address in (y.data_ptr(), z.data_ptr()) or z.data_ptr() == address
    del y, z


def test_without_record_stream_a_block_is_reused_at_once():
    x = torch.empty(MiB, dtype=torch.uint8, device="openreg")
    address = x.data_ptr()
    del x
    assert torch.empty(MiB, dtype=torch.uint8, device="openreg").data_ptr() == address


def test_record_stream_of_another_device_is_refused():
    x = torch.empty(4, device="openreg:0")
    with pytest.raises(RuntimeError, match="stream of the tensor's own device"):
        x.record_stream(torch.openreg.Stream(device=1))


# -- capacity and out of memory ---------------------------------------------------


def test_device_properties_report_the_capacity():
    props = torch.openreg.get_device_properties(0)
    free, total = torch.openreg.mem_get_info(0)
    assert props.total_memory == total == 8 * GiB
    assert 0 < free <= total
    assert torch.accelerator.get_memory_info(0) == (free, total)


def test_out_of_memory_raises_and_the_device_keeps_working():
    torch.openreg.empty_cache()
    baseline = torch.openreg.memory_allocated(0)
    ooms = torch.openreg.memory_stats(0)["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as error:
        torch.empty(9 * GiB, dtype=torch.uint8, device="openreg:0")
    message = str(error.value)
    assert "openreg out of memory. Tried to allocate 9.00 GiB" in message
    assert "openreg:0 has a total capacity of 8.00 GiB" in message
    assert "OPENREG_DEVICE_MEMORY" in message
    assert torch.openreg.memory_stats(0)["num_ooms"] == ooms + 1
    assert torch.openreg.memory_allocated(0) == baseline
    assert_close((torch.ones(3, device="openreg") + 1).cpu(), torch.full((3,), 2.0))


def test_cached_memory_is_released_and_the_allocation_retried_before_oom():
    torch.openreg.empty_cache()
    retries = torch.openreg.memory_stats(0)["num_alloc_retries"]
    big = torch.empty(5 * GiB, dtype=torch.uint8, device="openreg:0")
    del big  # cached, not returned
    assert torch.openreg.memory_reserved(0) >= 5 * GiB
    bigger = torch.empty(6 * GiB, dtype=torch.uint8, device="openreg:0")
    assert torch.openreg.memory_stats(0)["num_alloc_retries"] == retries + 1
    del bigger
    torch.openreg.empty_cache()


def test_device_memory_setting_sets_capacity_and_oom_threshold():
    result = run_python(
        """
        import torch
        print(torch.openreg.get_device_properties(0).total_memory)
        a = torch.empty(40 << 20, dtype=torch.uint8, device="openreg")
        try:
            torch.empty(40 << 20, dtype=torch.uint8, device="openreg")
        except torch.OutOfMemoryError as e:
            print("OOM", "64.00 MiB" in str(e))
        del a
        print(torch.empty(40 << 20, dtype=torch.uint8, device="openreg").numel())
        """,
        env={"OPENREG_DEVICE_MEMORY": "64M"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(64 * MiB), "OOM", "True", str(40 * MiB)]


def test_large_allocations_are_staggered_without_losing_capacity():
    # The runtime starts a large allocation 64 KiB behind the one before it
    # (kernels ran slower on operands exactly a power of two apart); the gap
    # stays free, so the whole capacity remains usable.
    result = run_python(
        """
        import torch
        MiB = 1 << 20
        a = torch.empty(16 * MiB, dtype=torch.uint8, device="openreg")
        b = torch.empty(16 * MiB, dtype=torch.uint8, device="openreg")
        print(b.data_ptr() - a.data_ptr(), torch.openreg.mem_get_info()[0])
        small = torch.empty(16, device="openreg")  # a 2 MiB small-pool segment
        print(small.data_ptr() - b.data_ptr())
        del a, b, small
        torch.openreg.empty_cache()
        halves = [torch.empty(32 * MiB, dtype=torch.uint8, device="openreg") for _ in range(2)]
        print(halves[1].data_ptr() - halves[0].data_ptr(), torch.openreg.mem_get_info()[0])
        """,
        env={"OPENREG_DEVICE_MEMORY": "64M"},
    )
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines == [[str(16 * MiB + 64 * 1024), str(32 * MiB)], [str(16 * MiB + 64 * 1024)], [str(32 * MiB), "0"]]


@pytest.mark.modes()  # a child process's start-up, the same under every launch switch
@pytest.mark.parametrize("value", ["lots", "0", "12Q", "-1G", "2T"])
def test_malformed_device_memory_setting_is_a_clear_error(value):
    result = run_python("import torch", env={"OPENREG_DEVICE_MEMORY": value})
    assert result.returncode != 0
    assert f"OPENREG_DEVICE_MEMORY='{value}' is not a memory size from 1M to 1T" in result.stderr


# -- torch.cuda's other allocator functions ---------------------------------------


def test_caching_allocator_alloc_hands_out_device_memory_until_deleted():
    torch.openreg.synchronize()
    before = torch.openreg.memory_allocated(1)
    stream = torch.openreg.Stream(device="openreg:1")
    ptr = torch.openreg.caching_allocator_alloc(3 * MiB, device=1, stream=stream)
    assert torch.openreg.memory_allocated(1) == before + 3 * MiB
    default_ptr = torch.openreg.caching_allocator_alloc(1024, "openreg:1")

    def segment_stream(address):
        [segment] = [s for s in torch.openreg.memory_snapshot()
                     if s["device"] == 1 and s["address"] <= address < s["address"] + s["total_size"]]
        return segment["stream"]

    assert segment_stream(ptr) == stream.stream_id  # from that stream's pool
    assert segment_stream(default_ptr) == torch.openreg.current_stream(1).stream_id
    torch.openreg.caching_allocator_delete(ptr)
    torch.openreg.caching_allocator_delete(default_ptr)
    assert torch.openreg.memory_allocated(1) == before
    with pytest.raises(ValueError, match="is not a pointer caching_allocator_alloc returned, or it was deleted"):
        torch.openreg.caching_allocator_delete(ptr)
    with pytest.raises(TypeError, match="stream must be None or a torch.openreg.Stream of openreg:0"):
        torch.openreg.caching_allocator_alloc(16, device=0, stream=stream)


def test_memory_snapshot_device_memory_used_and_the_allocator_backend():
    t = torch.empty(5 * MiB, dtype=torch.uint8, device="openreg:1")
    segments = torch.openreg.memory_snapshot()
    assert segments == torch.openreg.memory._snapshot()["segments"]
    mine = [s for s in segments if s["device"] == 1 and any(b["address"] == t.data_ptr() for b in s["blocks"])]
    assert len(mine) == 1 and mine[0]["total_size"] >= 5 * MiB
    free, total = torch.openreg.mem_get_info(1)
    assert torch.openreg.device_memory_used(1) == total - free >= torch.openreg.memory_reserved(1)
    assert torch.openreg.memory_snapshot(mempool_id=(0, 1 << 40)) == []  # no such private pool
    del t


def test_host_memory_stats_follow_pinned_allocations_with_torch_cuda_s_keys():
    # In a fresh process: a pinned block another test left behind becomes
    # inactive whenever its copy's event is next looked at.
    result = run_python("""
        import torch
        assert dict(torch.openreg.host_memory_stats()).get("active_requests.current", 0) == 0
        pinned = torch.empty(1 << 20, dtype=torch.uint8).pin_memory()
        during = torch.openreg.host_memory_stats()
        assert during["active_requests.current"] == 1 and during["active_bytes.current"] == 1 << 20, during
        assert during["allocations.current"] == 1 and during["allocated_bytes.current"] == 1 << 20, during
        assert during["num_host_alloc"] == 1, during
        nested = torch.openreg.host_memory_stats_as_nested_dict()
        assert set(nested) == {"num_host_alloc", "num_host_free", "allocations", "allocated_bytes",
                               "active_requests", "active_bytes", "host_alloc_time", "host_free_time"}
        assert set(nested["host_alloc_time"]) == {"total", "max", "min", "count", "avg"}
        assert nested["active_requests"] == {"current": 1, "peak": 1, "allocated": 1, "freed": 0}
        del pinned
        after = torch.openreg.host_memory_stats()
        assert after["active_requests.current"] == 0 and after["allocations.current"] == 1, after  # cached
        torch.openreg.reset_accumulated_host_memory_stats()
        torch.openreg.reset_peak_host_memory_stats()
        after = torch.openreg.host_memory_stats()
        assert after["active_requests.allocated"] == after["active_requests.freed"] == 0, after
        assert after["active_requests.peak"] == 0, after
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr


# -- caching off (caching_allocator_enable / caching_allocator_disabled) ---------------------


def device_used(device=0):
    free, total = torch.openreg.mem_get_info(device)
    return total - free


def test_with_caching_disabled_memory_goes_back_when_the_tensor_goes():
    torch.openreg.empty_cache()
    reserved, used = torch.openreg.memory_reserved(), device_used()
    with torch.openreg.caching_allocator_disabled():
        x = torch.arange(3 * MiB, dtype=torch.float32, device="openreg")
        assert device_used() >= used + 12 * MiB
        assert torch.openreg.memory_reserved() == reserved  # not the cache's, as in CUDA
        assert torch.equal((x[:5] * 2).cpu(), torch.arange(5.0) * 2)
        del x
        assert device_used() == used
    y = torch.empty(3 * MiB, dtype=torch.float32, device="openreg")  # cached again
    assert torch.openreg.memory_reserved() > reserved
    del y


def test_caching_disabled_context_restores_the_previous_setting():
    assert torch_openreg._C._caching_allocator_is_enabled()
    torch.openreg.caching_allocator_enable(False)
    try:
        with torch.openreg.caching_allocator_disabled():
            assert not torch_openreg._C._caching_allocator_is_enabled()
        assert not torch_openreg._C._caching_allocator_is_enabled()
    finally:
        torch.openreg.caching_allocator_enable(True)
    with torch.openreg.caching_allocator_disabled():
        pass
    assert torch_openreg._C._caching_allocator_is_enabled()


def test_free_with_caching_disabled_waits_for_the_kernels_using_the_memory():
    gc.collect()
    torch.openreg.empty_cache()
    used = device_used()
    s = torch.openreg.Stream()
    with torch.openreg.caching_allocator_disabled():
        src = torch.arange(MiB, dtype=torch.float32, device="openreg")
        s.wait_stream(torch.openreg.current_stream())  # before the switch: inside, the current stream is s
        with torch.openreg.stream(s):
            torch.openreg._sleep(200)
            out = src * 2  # queued behind the sleep, reads src
        src.record_stream(s)
        del src  # orFree waits for s: out is computed from src, not from freed pages
        torch.openreg.current_stream().wait_stream(s)  # out is s's
        assert torch.equal(out.cpu(), torch.arange(MiB, dtype=torch.float32) * 2)
        del out
    assert device_used() == used


def test_queued_work_with_caching_disabled_leaves_no_device_memory_behind():
    gc.collect()
    torch.openreg.empty_cache()
    used = device_used()
    a = torch.randn(256, 512)
    with torch.openreg.caching_allocator_disabled():
        x = a.to("openreg")
        s = torch.openreg.Stream()
        s.wait_stream(torch.openreg.current_stream())
        with torch.openreg.stream(s):
            torch.openreg._sleep(100)
            results = [torch.sort(x, dim=0).values, x.cumsum(0, dtype=torch.float64), x @ x.T, x.to(torch.bfloat16)]
        s.synchronize()
        expected = [torch.sort(a, dim=0).values, a.cumsum(0, dtype=torch.float64), a @ a.T, a.to(torch.bfloat16)]
        for got, want in zip(results, expected):
            torch.testing.assert_close(got.cpu(), want)
        x.record_stream(s)
        del x, results, got
    torch.openreg.empty_cache()  # also frees what a worker freed with caching off
    assert device_used() == used


def test_environment_variable_starts_the_process_with_caching_off():
    code = (
        "import torch, torch_openreg; x = torch.ones(1 << 20, device='openreg'); "
        "print(torch_openreg._C._caching_allocator_is_enabled(), torch.openreg.memory_reserved())"
    )
    env = dict(os.environ, PYTORCH_NO_OPENREG_MEMORY_CACHING="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "0"]
