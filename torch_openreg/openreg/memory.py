"""Device memory of openreg, as torch.cuda.memory.

The numbers come from openreg's caching allocator through the device-generic
``torch.accelerator`` memory API, so both report the same values. Each device
has ``OPENREG_DEVICE_MEMORY`` bytes (default 8G); beyond that, allocation
raises ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

import contextlib
import ctypes
import pickle
import re
import sys
import types
import warnings
from collections import OrderedDict
from typing import Any

import torch
import torch.cuda.memory

from torch_openreg import _C

__all__ = [
    "MemPool",
    "OpenRegPluggableAllocator",
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "caching_allocator_disabled",
    "caching_allocator_enable",
    "change_current_allocator",
    "device_memory_used",
    "empty_cache",
    "get_allocator_backend",
    "get_per_process_memory_fraction",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_host_memory_stats",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "use_mem_pool",
]


def _index(device: Any) -> int:
    from torch_openreg.openreg import _device_index, _lazy_init

    _lazy_init()
    return _device_index(device)


def empty_cache() -> None:
    """Returns the cached, unused device memory of every openreg device to the runtime."""
    torch.accelerator.empty_cache()


def memory_stats(device: Any = None) -> OrderedDict[str, Any]:
    """The caching allocator's statistics, keyed as torch.cuda.memory_stats."""
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device: Any = None) -> int:
    """Bytes occupied by tensors on ``device``."""
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device: Any = None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device: Any = None) -> int:
    """Bytes the caching allocator holds on ``device``, in use or cached."""
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device: Any = None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of ``device``, as torch.cuda.mem_get_info."""
    return torch.accelerator.get_memory_info(_index(device))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limits the caching allocator of ``device`` to ``fraction`` (0 to 1) of its
    capacity, as torch.cuda.set_per_process_memory_fraction: an allocation beyond
    it frees the cache, retries, then raises torch.OutOfMemoryError."""
    index = _index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C._set_memory_fraction(fraction, index)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set by set_per_process_memory_fraction (1.0 by default)."""
    return _C._get_memory_fraction(_index(device))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """memory_stats() nested at its dots, as torch.cuda.memory_stats_as_nested_dict:
    ``stats["allocated_bytes"]["all"]["current"]``."""
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        *path, leaf = key.split(".")
        level = nested
        for part in path:
            level = level.setdefault(part, {})
        level[leaf] = value
    return nested


def memory_cached(device: Any = None) -> int:
    """Deprecated in torch.cuda: memory_reserved()."""
    warnings.warn("torch.openreg.memory_cached has been renamed to torch.openreg.memory_reserved", FutureWarning)
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated in torch.cuda: max_memory_reserved()."""
    warnings.warn(
        "torch.openreg.max_memory_cached has been renamed to torch.openreg.max_memory_reserved", FutureWarning)
    return max_memory_reserved(device)


def reset_max_memory_allocated(device: Any = None) -> None:
    """Deprecated in torch.cuda: resets every peak statistic (reset_peak_memory_stats)."""
    warnings.warn(
        "torch.openreg.reset_max_memory_allocated now calls torch.openreg.reset_peak_memory_stats, which resets "
        "/all/ peak memory stats.", FutureWarning)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Deprecated in torch.cuda: resets every peak statistic (reset_peak_memory_stats)."""
    warnings.warn(
        "torch.openreg.reset_max_memory_cached now calls torch.openreg.reset_peak_memory_stats, which resets "
        "/all/ peak memory stats.", FutureWarning)
    reset_peak_memory_stats(device)


# torch.cuda.memory_summary's own code, reading openreg's statistics: the same
# table, rows and units, so what parses or reads CUDA's summary reads this one.
_cuda_summary = types.FunctionType(
    torch.cuda.memory.memory_summary.__code__,
    {**vars(torch.cuda.memory), "memory_stats": memory_stats, "_get_device_index": lambda device, optional: device},
    "memory_summary",
    torch.cuda.memory.memory_summary.__defaults__,
)
# The header lines name the device. Each name is right-aligned over CUDA's text
# and the blanks before it, so a line keeps CUDA's width for a device name of up
# to 16 letters, not only for this one's 7 (tools/rename_backend.py).
_SUMMARY_NAMES = (("PyTorch CUDA memory summary", "PyTorch openreg memory summary"),
                  ("CUDA OOMs", "openreg OOMs"),
                  ("cudaMalloc retries", "malloc retries"))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """The caching allocator's statistics as a table, in the layout of
    torch.cuda.memory_summary (rows: allocated, active, requested, reserved and
    non-releasable bytes, allocations, segments, oversize ones; columns:
    current, peak, total allocated, total freed; per pool unless ``abbreviated``)."""
    summary = _cuda_summary(_index(device), abbreviated)
    for cuda, ours in _SUMMARY_NAMES:
        summary = re.sub(" *" + re.escape(cuda), lambda m: ours.rjust(len(m.group())), summary, count=1)
    return summary


def _record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
) -> None:
    """Records the allocator's history for _snapshot(), as
    torch.cuda.memory._record_memory_history: ``enabled`` None (off), "state"
    (live blocks keep the stack that allocated them) or "all" (also a trace of
    alloc, free and segment events, at most ``max_entries`` per device, the
    oldest dropped); ``context`` None, "state", "alloc" or "all" (which events
    keep a stack); ``stacks`` "python" or "all" (C++ frames too). Every device
    is recorded (``device`` is accepted for torch.cuda's signature)."""
    if device is not None:
        _index(device)
    if isinstance(enabled, bool):
        raise TypeError("_record_memory_history(enabled=...) takes None, 'state' or 'all', not a bool")
    _C._record_memory_history(enabled, context, stacks, max_entries, clear_history)


def _snapshot(device: Any = None) -> dict[str, Any]:
    """The allocator's state, as torch.cuda.memory._snapshot(): ``segments``
    (every device's, each with its ``blocks``, their state and the stack that
    allocated them) and ``device_traces`` (per device, the recorded events,
    oldest first). torch.cuda._memory_viz reads it: ``python -m
    torch.cuda._memory_viz trace_plot snapshot.pickle -o trace.html``."""
    if device is not None:
        _index(device)
    return _C._memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles _snapshot() to ``filename``, as torch.cuda.memory._dump_snapshot
    (PyTorch's memory viewer, pytorch.org/memory_viz, opens the file)."""
    snapshot = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


def memory_snapshot(mempool_id: tuple[int, int] | None = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """The segments of every device and their blocks, as torch.cuda.memory_snapshot
    (``_snapshot()["segments"]``); with ``mempool_id`` (a MemPool's ``id``), only
    that private pool's segments."""
    segments = _snapshot()["segments"]
    if mempool_id is None:
        return segments
    return [s for s in segments if s["segment_pool_id"] == tuple(mempool_id)]


class MemPool:
    """A private pool of openreg's caching allocator, as torch.cuda.MemPool: the
    allocations made on its device inside ``use_mem_pool(pool)`` come from
    segments of its own, which no other allocation uses, and which it keeps
    cached (``empty_cache`` leaves them) until the pool is deleted.

    ``allocator`` (an OpenRegPluggableAllocator): the pool's segments come from
    its alloc function and go back to its free function instead of the runtime;
    the pool still splits and caches them. ``use_on_oom``: an allocation outside
    every private pool that finds no device memory may take this pool's cached
    blocks, as a last resort. ``no_split``: the pool's blocks are never split, so
    each allocation takes a whole cached block or a new segment."""

    def __init__(self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False):
        if allocator is not None and not isinstance(allocator, OpenRegPluggableAllocator):
            raise TypeError(
                f"torch.openreg.MemPool(allocator=...) takes an OpenRegPluggableAllocator, not {type(allocator).__name__}")
        from torch_openreg.openreg import current_device

        self._allocator = allocator  # keeps its library loaded
        functions = allocator._functions if allocator is not None else (0, 0)
        self._device = current_device()
        self._uid = _C._mem_pool_create(self._device, *functions, bool(use_on_oom), bool(no_split))

    @property
    def allocator(self) -> OpenRegPluggableAllocator | None:
        """The pool's allocator (None: the caching allocator's own device memory)."""
        return self._allocator

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, (0, n) as for a user-created pool of torch.cuda."""
        return (0, self._uid)

    @property
    def device(self) -> torch.device:
        return torch.device("openreg", self._device)

    def use_count(self) -> int:
        """1 for the pool itself, and one per use_mem_pool it is active in."""
        return _C._mem_pool_use_count(self._device, self._uid)

    def snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
        """The pool's segments, as memory_snapshot(pool.id)."""
        return memory_snapshot(self.id, include_traces)

    def __del__(self) -> None:
        uid = getattr(self, "_uid", None)
        if uid is not None and _C is not None:
            _C._mem_pool_release(self._device, uid)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None):
    """Routes this thread's allocations on ``device`` (default: the current
    device) to ``pool`` until the block ends, as torch.cuda.use_mem_pool; other
    threads (autograd's backward thread, a stream's worker) keep allocating
    from the default pools. Nested blocks route to the innermost pool."""
    index = _index(device)
    if index != pool._device:
        raise ValueError(f"use_mem_pool: the pool belongs to openreg:{pool._device}, not openreg:{index}")
    _C._mem_pool_begin(index, pool._uid)
    try:
        yield
    finally:
        _C._mem_pool_end(index, pool._uid)


def _set_allocator_settings(settings: str) -> None:
    """Sets the caching allocator's options, in PYTORCH_OPENREG_ALLOC_CONF's syntax
    ("max_split_size_mb:64,garbage_collection_threshold:0.8"), as
    torch.cuda.memory._set_allocator_settings; a malformed text raises ValueError
    naming the key and the values it accepts, and changes nothing."""
    _C._set_allocator_settings(settings)


def _get_allocator_settings() -> str:
    """The text of the options in effect (PYTORCH_OPENREG_ALLOC_CONF or the last
    _set_allocator_settings); "" when none was set."""
    return _C._get_allocator_settings()


def get_allocator_backend() -> str:
    """"native", openreg's caching allocator, or "pluggable" after
    change_current_allocator (torch.cuda's other one, cudaMallocAsync, is CUDA's
    driver allocator)."""
    return "native" if _current_allocator is None else "pluggable"


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """``size`` bytes of device memory from the caching allocator, for another
    framework's use, as torch.cuda.caching_allocator_alloc: from the pool of
    ``stream`` (default: the current stream of ``device``, default the current
    device). Returns the device address; give it back with caching_allocator_delete."""
    index = _index(device)
    if stream is None:
        stream_id = _C._current_stream_id(index)
    elif isinstance(stream, torch.Stream) and stream.device == torch.device("openreg", index):
        stream_id = stream.stream_id
    else:
        raise TypeError(f"caching_allocator_alloc: stream must be None or a torch.openreg.Stream of openreg:{index}, "
                        f"got {stream!r}")
    return _C._caching_allocator_alloc(size, index, stream_id)


def caching_allocator_delete(mem_ptr: int) -> None:
    """Gives back memory that caching_allocator_alloc returned, as
    torch.cuda.caching_allocator_delete; an address it did not return raises ValueError."""
    _C._caching_allocator_delete(mem_ptr)


def caching_allocator_enable(value: bool = True) -> None:
    """Turns openreg's caching allocator on or off, as torch.cuda.caching_allocator_enable.

    Off, each allocation is a device allocation of its own and each free gives it
    back at once, after the work queued on the device (as cudaFree): no cached
    block hides a leak, and an address kept past its tensor's life points to freed
    pages rather than to a block handed to another tensor. Off is slow; it is for
    finding such bugs. Its memory is not in memory_stats (as CUDA's). Blocks allocated while
    caching was on stay cached. ``PYTORCH_NO_OPENREG_MEMORY_CACHING=1`` starts a
    process with caching off. Unlike torch.cuda's, it takes effect also before the
    device is initialised."""
    _C._caching_allocator_enable(bool(value))


@contextlib.contextmanager
def caching_allocator_disabled():
    """The caching allocator off inside the block, as torch.cuda.caching_allocator_disabled."""
    previous = _C._caching_allocator_is_enabled()
    caching_allocator_enable(False)
    try:
        yield
    finally:
        caching_allocator_enable(previous)


class OpenRegPluggableAllocator:
    """An openreg memory allocator loaded from a shared library, as
    torch.cuda.memory.CUDAPluggableAllocator. The library's two functions (C
    linkage) have the signatures::

        void* alloc(ssize_t size, int device, openreg::orStream_t stream);
        void free(void* ptr, ssize_t size, int device, openreg::orStream_t stream);

    ``alloc`` must return device memory of ``device`` (from ``openreg::orMalloc``,
    csrc/runtime/OpenRegRuntime.h: link the library to torch_openreg's ``_C``) at
    least ``size`` bytes long, or null when out of memory; ``free`` gets back the
    pointer with the size, device and stream of its allocation (the current stream
    then). Install it with change_current_allocator."""

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str) -> None:
        self._library = ctypes.CDLL(path_to_so_file)
        self._functions = []
        for role, name in (("alloc", alloc_fn_name), ("free", free_fn_name)):
            try:
                function = getattr(self._library, name)
            except AttributeError:
                raise AttributeError(
                    f"OpenRegPluggableAllocator: {path_to_so_file} has no function {name!r} (the {role} function); "
                    "declare it extern \"C\" so that its name is not mangled"
                ) from None
            self._functions.append(ctypes.cast(function, ctypes.c_void_p).value)


_current_allocator: OpenRegPluggableAllocator | None = None


def change_current_allocator(allocator: OpenRegPluggableAllocator) -> None:
    """Makes ``allocator`` serve every later openreg allocation, as
    torch.cuda.memory.change_current_allocator: only before openreg has allocated
    device memory in this process (RuntimeError otherwise). Its memory is not in
    memory_stats; get_allocator_backend() says "pluggable"."""
    global _current_allocator
    if not isinstance(allocator, OpenRegPluggableAllocator):
        raise TypeError(f"change_current_allocator expects an OpenRegPluggableAllocator, got {type(allocator).__name__}")
    _C._change_current_allocator(*allocator._functions)
    _current_allocator = allocator  # keeps its library loaded


def device_memory_used(device: Any = None) -> int:
    """Bytes of ``device`` in use, as the driver sees them (torch.cuda reads
    them from nvidia-smi): every segment the caching allocator holds, in use
    or cached."""
    free, total = mem_get_info(device)
    return total - free


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """The pinned host allocator's statistics, nested as
    torch.cuda.host_memory_stats_as_nested_dict: ``allocations``,
    ``allocated_bytes``, ``active_requests``, ``active_bytes`` (each current,
    peak, allocated, freed), ``num_host_alloc``, ``num_host_free`` and
    ``host_alloc_time`` / ``host_free_time`` (microseconds: total, max, min, count, avg)."""
    return _C._host_memory_stats()


def host_memory_stats() -> OrderedDict[str, Any]:
    """host_memory_stats_as_nested_dict() flattened at dots and sorted, as torch.cuda.host_memory_stats."""
    flat: list[tuple[str, Any]] = []

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat.append((prefix, value))

    add("", host_memory_stats_as_nested_dict())
    return OrderedDict(sorted(flat))


def reset_accumulated_host_memory_stats() -> None:
    """Resets the "allocated" and "freed" counts of host_memory_stats."""
    _C._reset_accumulated_host_memory_stats()


def reset_peak_host_memory_stats() -> None:
    """Resets the "peak" counts of host_memory_stats."""
    _C._reset_peak_host_memory_stats()
