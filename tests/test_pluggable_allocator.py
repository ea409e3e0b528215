"""A pluggable device allocator, as torch.cuda's CUDAPluggableAllocator: a shared
library's alloc and free functions serve every openreg allocation once
change_current_allocator installed them (before the first allocation).

Each case runs in a fresh process: the allocator can only be changed before
openreg allocates anything."""

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch

import torch_openreg

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

# Its module fixture is built once: one pytest-xdist worker runs the file.
pytestmark = pytest.mark.xdist_group("pluggable_allocator")

REPO = Path(__file__).resolve().parent.parent

LIBRARY = r"""
#include <sys/types.h>

#include <atomic>
#include <cstdlib>

#include "runtime/OpenRegRuntime.h"

namespace {
std::atomic<long> allocations{0};
std::atomic<long> frees{0};
std::atomic<long> live_bytes{0};
} // namespace

extern "C" {
// Device memory from the runtime, counted.
void* counting_alloc(ssize_t size, int device, openreg::orStream_t /*stream*/) {
  int previous = 0;
  openreg::orGetDevice(&previous);
  openreg::orSetDevice(device);
  void* ptr = nullptr;
  const openreg::orError status = openreg::orMalloc(&ptr, static_cast<size_t>(size));
  openreg::orSetDevice(previous);
  if (status != openreg::orError::Success) {
    return nullptr;
  }
  ++allocations;
  live_bytes += size;
  return ptr;
}

void counting_free(void* ptr, ssize_t size, int /*device*/, openreg::orStream_t /*stream*/) {
  openreg::orFree(ptr);
  ++frees;
  live_bytes -= size;
}

long counted_allocations() { return allocations; }
long counted_frees() { return frees; }
long counted_live_bytes() { return live_bytes; }

// Host memory: not what an openreg allocator may return.
void* host_alloc(ssize_t size, int, openreg::orStream_t) { return std::malloc(static_cast<size_t>(size)); }
void host_free(void* ptr, ssize_t, int, openreg::orStream_t) { std::free(ptr); }
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("allocator")
    source = directory / "allocator.cpp"
    source.write_text(LIBRARY)
    extension = Path(torch_openreg._C.__file__)
    out = directory / "liballocator.so"
    command = [
        os.environ.get("CXX", "c++"), "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{REPO / 'csrc'}", str(source),
        "-o", str(out), f"-L{extension.parent}", f"-l:{extension.name}", f"-Wl,-rpath,{extension.parent}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out


def run(library: Path, body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        f"""
        import ctypes, gc
        import torch
        from torch.openreg.memory import OpenRegPluggableAllocator, change_current_allocator
        LIBRARY = {str(library)!r}
        counts = ctypes.CDLL(LIBRARY)
        """
    ) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_every_allocation_comes_from_the_library_and_goes_back_to_it(library):
    result = run(library, """
        change_current_allocator(OpenRegPluggableAllocator(LIBRARY, "counting_alloc", "counting_free"))
        assert torch.openreg.memory.get_allocator_backend() == "pluggable"
        a, b = torch.randn(300, 200), torch.randn(200, 100)
        x, y = a.to("openreg"), b.to("openreg:1")
        out = (x @ y.to("openreg")).relu().sum(0)
        torch.testing.assert_close(out.cpu(), (a @ b).relu().sum(0))
        assert counts.counted_allocations() >= 4 and counts.counted_live_bytes() >= 4 * (300 * 200 + 200 * 100)
        assert torch.openreg.memory_allocated() == 0  # not the caching allocator's, as in CUDA
        del x, y, out
        gc.collect()
        torch.openreg.synchronize()
        torch.openreg.empty_cache()
        assert counts.counted_frees() == counts.counted_allocations(), (counts.counted_frees(), counts.counted_allocations())
        assert counts.counted_live_bytes() == 0
        print("ok")
    """)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_allocator_cannot_change_once_openreg_has_allocated(library):
    result = run(library, """
        x = torch.ones(4, device="openreg")
        try:
            change_current_allocator(OpenRegPluggableAllocator(LIBRARY, "counting_alloc", "counting_free"))
        except RuntimeError as e:
            print(e)
        assert torch.openreg.memory.get_allocator_backend() == "native"
        assert (x + 1).sum().item() == 8 and counts.counted_allocations() == 0
    """)
    assert result.returncode == 0, result.stderr
    assert "can't swap an already initialized allocator" in result.stdout
    assert "Change the allocator before the first openreg tensor is made" in result.stdout


def test_host_memory_from_the_library_is_refused_with_the_reason(library):
    result = run(library, """
        change_current_allocator(OpenRegPluggableAllocator(LIBRARY, "host_alloc", "host_free"))
        try:
            torch.ones(4, device="openreg")
        except RuntimeError as e:
            print(e)
    """)
    assert result.returncode == 0, result.stderr
    assert "which is not 16 bytes of openreg:0's memory" in result.stdout
    assert "must return device memory of the device it is asked for" in result.stdout


def test_library_without_the_named_function_is_refused(library):
    with pytest.raises(AttributeError, match=r"has no function 'no_such_alloc' \(the alloc function\)"):
        torch.openreg.memory.OpenRegPluggableAllocator(str(library), "no_such_alloc", "counting_free")
    with pytest.raises(TypeError, match="expects an OpenRegPluggableAllocator"):
        torch.openreg.memory.change_current_allocator(object())


def test_out_of_memory_from_the_library_is_torchs_out_of_memory_error(library):
    result = run(library, """
        change_current_allocator(OpenRegPluggableAllocator(LIBRARY, "counting_alloc", "counting_free"))
        try:
            torch.empty(1 << 40, dtype=torch.uint8, device="openreg")
        except torch.OutOfMemoryError as e:
            print(e)
        assert torch.ones(3, device="openreg").sum().item() == 3
    """)
    assert result.returncode == 0, result.stderr
    assert "with the pluggable allocator (its alloc function returned null)" in result.stdout


def test_a_mem_pool_with_an_allocator_takes_its_segments_from_the_library(library):
    """MemPool(allocator=), as torch.cuda's: the pool's segments come from the
    library (split and cached as usual), every other allocation from the runtime."""
    import ctypes
    import gc

    counts = ctypes.CDLL(str(library))
    allocator = torch.openreg.memory.OpenRegPluggableAllocator(str(library), "counting_alloc", "counting_free")
    allocations, frees = counts.counted_allocations(), counts.counted_frees()
    pool = torch.openreg.MemPool(allocator=allocator)
    assert pool.allocator is allocator
    a = torch.randn(600, 500)  # 1.2 MB: a large segment
    with torch.openreg.use_mem_pool(pool):
        x = a.to("openreg")
        y = torch.empty(10, device="openreg")  # a small block: its own small segment
        z = torch.empty(20, device="openreg")  # split from y's segment
    outside = torch.empty(1000, device="openreg")
    assert counts.counted_allocations() - allocations == 2
    segments = pool.snapshot()
    assert len(segments) == 2 and all(
        any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segments) for t in (x, y, z)
    )
    torch.testing.assert_close((x * 2).cpu(), a * 2)
    del x, y, z, outside, pool
    gc.collect()
    torch.openreg.synchronize()
    assert counts.counted_frees() - frees == 2  # the pool's segments went back to the library


def test_a_pool_s_segments_go_back_to_its_library_after_the_pool_is_gone(library):
    import ctypes
    import gc

    counts = ctypes.CDLL(str(library))
    allocator = torch.openreg.memory.OpenRegPluggableAllocator(str(library), "counting_alloc", "counting_free")
    allocations, frees = counts.counted_allocations(), counts.counted_frees()
    pool = torch.openreg.MemPool(allocator=allocator)
    with torch.openreg.use_mem_pool(pool):
        t = torch.ones(600, 500, device="openreg")
    del pool, allocator  # the block outlives its pool
    gc.collect()
    assert t.sum().item() == 600 * 500
    assert counts.counted_allocations() - allocations == 1 and counts.counted_frees() == frees
    del t
    torch.openreg.empty_cache()
    assert counts.counted_frees() - frees == 1
