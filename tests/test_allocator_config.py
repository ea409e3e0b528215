"""The caching allocator's options (PYTORCH_OPENREG_ALLOC_CONF, as
PYTORCH_CUDA_ALLOC_CONF) and the statistics they drive: inactive split blocks,
oversize allocations and segments, garbage collection under a memory fraction.

The statistics depend on every block of a device, so each check runs in a
fresh process, where the device holds nothing but what the check allocates."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

MiB = 1 << 20


def run_checks(code: str, settings: str | None = None) -> None:
    env = dict(os.environ)
    env.pop("PYTORCH_OPENREG_ALLOC_CONF", None)
    env["OPENREG_DEVICE_MEMORY"] = "8G"  # the sizes below are chosen for it
    if settings is not None:
        env["PYTORCH_OPENREG_ALLOC_CONF"] = settings
    prelude = textwrap.dedent("""
        import torch
        MiB = 1 << 20
        def stat(name, device=1):
            return torch.openreg.memory_stats(device)[name]
    """)
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_free_blocks_of_split_segments_count_as_inactive_split():
    run_checks("""
        x = torch.empty(256, device="openreg:1")  # 1 KiB of a new 2 MiB segment; the rest is split off
        assert stat("inactive_split.all.current") == 1
        assert stat("inactive_split_bytes.small_pool.current") == 2 * MiB - 1024
        y = torch.empty(256, device="openreg:1")
        assert stat("inactive_split.all.current") == 1
        assert stat("inactive_split_bytes.all.current") == 2 * MiB - 2048
        del x
        assert stat("inactive_split.all.current") == 2
        assert stat("inactive_split_bytes.all.current") == 2 * MiB - 1024
        del y
        assert stat("inactive_split.all.current") == 3
        assert stat("inactive_split_bytes.all.current") == 2 * MiB
        z = torch.empty(30 * MiB // 4, device="openreg:1")  # a large-pool segment of its own size: not split
        assert stat("inactive_split.large_pool.current") == 0
        del z
        torch.openreg.empty_cache()  # the blocks merge back into whole segments, which go
        assert stat("inactive_split.all.current") == 0
        assert stat("inactive_split_bytes.all.current") == 0
        assert stat("inactive_split.all.peak") == 3
        assert torch.openreg.memory_reserved(1) == 0
    """)


def test_max_split_size_keeps_oversize_blocks_whole_as_on_cuda():
    code = """
        limit = {limit}
        assert stat("max_split_size") == (limit * MiB if limit else -1)
        a = torch.empty(60 * MiB, dtype=torch.uint8, device="openreg:1")
        assert stat("oversize_allocations.current") == (1 if limit else 0)
        assert stat("oversize_segments.current") == (1 if limit else 0)
        del a
        segments = stat("num_device_alloc")
        # Below the limit a request does not split the cached 60 MiB block.
        b = torch.empty(30 * MiB, dtype=torch.uint8, device="openreg:1")
        assert stat("num_device_alloc") == segments + (1 if limit else 0)
        del b
        torch.openreg.empty_cache()
        a = torch.empty(60 * MiB, dtype=torch.uint8, device="openreg:1")
        del a
        segments = stat("num_device_alloc")
        # An oversize request takes a cached block at most 20 MiB larger, whole.
        c = torch.empty(50 * MiB, dtype=torch.uint8, device="openreg:1")
        assert stat("num_device_alloc") == segments
        assert torch.openreg.memory_allocated(1) == (60 if limit else 50) * MiB
        del c
        d = torch.empty(30 * MiB, dtype=torch.uint8, device="openreg:1")  # more than 20 MiB smaller
        assert stat("num_device_alloc") == segments + (1 if limit else 0)
        del d
        assert stat("oversize_allocations.current") == 0
        torch.openreg.empty_cache()
        assert stat("oversize_segments.current") == 0
        assert stat("oversize_segments.peak") == (1 if limit else 0)
    """
    run_checks(code.format(limit=40), settings="max_split_size_mb:40")
    run_checks(code.format(limit=0))  # the same program without the option: CUDA's default


def test_garbage_collection_returns_the_segments_longest_unused_before_the_limit():
    code = """
        torch.openreg.set_per_process_memory_fraction(0.5, 1)  # 4 GiB of the 8 GiB device
        a = torch.empty(1536 * MiB, dtype=torch.uint8, device="openreg:1")
        b = torch.empty(768 * MiB, dtype=torch.uint8, device="openreg:1")
        del a, b  # 2.25 GiB cached, above the threshold's 2 GiB
        frees = stat("num_device_free")
        c = torch.empty(1600 * MiB, dtype=torch.uint8, device="openreg:1")  # fits no cached block
        collected = {collected}
        assert stat("num_device_free") == frees + (2 if collected else 0)
        assert torch.openreg.memory_reserved(1) == (1600 if collected else 1536 + 768 + 1600) * MiB
        assert stat("num_ooms") == 0
    """
    run_checks(code.format(collected=True), settings="garbage_collection_threshold:0.5")
    run_checks(code.format(collected=False))


def test_the_environment_variable_sets_the_options_and_they_can_be_changed():
    run_checks("""
        from torch_openreg import _C
        torch.openreg.init()
        assert torch.openreg.memory._get_allocator_settings() == "max_split_size_mb:64, expandable_segments:False"
        assert stat("max_split_size", 0) == 64 * MiB
        torch.openreg.memory._set_allocator_settings("garbage_collection_threshold:0.9")
        assert stat("max_split_size", 0) == -1  # every option not given is back to its default
        assert torch.openreg.memory._get_allocator_settings() == "garbage_collection_threshold:0.9"
    """, settings="max_split_size_mb:64, expandable_segments:False")


def test_cached_blocks_beyond_the_release_threshold_give_their_pages_back():
    # Device memory is the process's memory: the resident set follows what is
    # allocated, not what the cache holds, once the cache holds more than the
    # threshold; the blocks stay cached (memory_reserved) and are reused.
    run_checks("""
        def rss():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
        def cycle():
            x = torch.ones(64 * MiB // 4, device="openreg:1")  # every page written
            torch.openreg.synchronize(1)
            ptr = x.data_ptr()
            del x
            torch.openreg.synchronize(1)
            return ptr
        ptr = cycle()
        base = rss()
        for i in range(2):
            x = torch.ones(64 * MiB // 4, device="openreg:1")
            assert x.data_ptr() == ptr  # the cached block is reused
            torch.openreg.synchronize(1)
            assert rss() > base + 48 * MiB, (rss(), base)  # in use: resident
            del x
            torch.openreg.synchronize(1)
            assert stat("reserved_bytes.all.current") >= 64 * MiB  # still cached
            assert rss() < base + 16 * MiB, (rss(), base)  # beyond the threshold: given back
        torch.openreg.memory._set_allocator_settings("release_threshold_mb:1024")
        y = torch.ones(64 * MiB // 4, device="openreg:1")
        torch.openreg.synchronize(1)
        del y
        torch.openreg.synchronize(1)
        assert rss() > base + 48 * MiB  # within the threshold: stays resident
    """, settings="release_threshold_mb:0")


def test_blocks_freed_inside_kernels_stay_cached_under_any_release_threshold():
    # A queued kernel that promotes an operand allocates the copy from its
    # stream worker's own pool and frees it as it ends, on the worker.
    run_checks("""
        x = torch.randn(2048, 2048, device="openreg:1")
        y = torch.randn(2048, 2048, device="openreg:1", dtype=torch.float64)
        for _ in range(4):  # the (operator, dtypes) pair's later launches are queued
            z = x * y
        torch.openreg.synchronize(1)
        assert torch.equal(z.cpu(), x.cpu() * y.cpu())
    """, settings="release_threshold_mb:0")


MALFORMED = [
    ("max_split_size_mb:abc", "max_split_size_mb takes a whole number of MiB, at least 20; got 'abc'"),
    ("max_split_size_mb:10", "max_split_size_mb takes a whole number of MiB, at least 20; got '10'"),
    ("max_split_size_mb:-30", "max_split_size_mb takes a whole number of MiB, at least 20; got '-30'"),
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold takes a number between 0 and 1"),
    ("garbage_collection_threshold:x", "garbage_collection_threshold takes a number between 0 and 1"),
    ("expandable_segments:maybe", "expandable_segments takes True or False; got 'maybe'"),
    ("expandable_segments:True", "expandable_segments:True is not supported by openreg"),
    ("max_split_size:64", "unknown key 'max_split_size'. Accepted keys: max_split_size_mb, "
                          "garbage_collection_threshold, release_threshold_mb, expandable_segments"),
    ("release_threshold_mb:-1", "release_threshold_mb takes a whole number of MiB (0: give every cached "
                                "block's pages back); got '-1'"),
    ("max_split_size_mb=64", "'max_split_size_mb=64' is not key:value"),
]


@pytest.mark.parametrize("settings,message", MALFORMED, ids=[s for s, _ in MALFORMED])
def test_malformed_settings_name_the_key_and_change_nothing(settings, message):
    before = torch.openreg.memory._get_allocator_settings()
    with pytest.raises(ValueError, match="_set_allocator_settings: " + __import__("re").escape(message)):
        torch.openreg.memory._set_allocator_settings(settings)
    assert torch.openreg.memory._get_allocator_settings() == before
    assert torch.openreg.memory_stats()["max_split_size"] == -1


def test_a_malformed_environment_variable_fails_the_first_use_with_its_name():
    run_checks("""
        for attempt in range(2):  # every use raises, none crashes
            try:
                torch.ones(1, device="openreg")
            except ValueError as e:
                assert "PYTORCH_OPENREG_ALLOC_CONF: unknown key 'bogus'" in str(e), e
            else:
                raise AssertionError("no error")
    """, settings="bogus:1")
