"""Device memory of openreg, as torch.cuda.memory.

The numbers come from openreg's caching allocator through the device-generic
``torch.accelerator`` memory API, so both report the same values. Each device
has ``OPENREG_DEVICE_MEMORY`` bytes (default 8G); beyond that, allocation
raises ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

import pickle
import sys
import types
import warnings
from collections import OrderedDict
from typing import Any

import torch
import torch.cuda.memory

from torch_openreg import _C

__all__ = [
    "empty_cache",
    "get_per_process_memory_fraction",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
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
# The header lines name the device; each replacement keeps the line's width.
_SUMMARY_NAMES = (("   PyTorch CUDA memory summary", "PyTorch openreg memory summary"),
                  ("   CUDA OOMs", "openreg OOMs"),
                  ("  cudaMalloc retries", "      malloc retries"))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """The caching allocator's statistics as a table, in the layout of
    torch.cuda.memory_summary (rows: allocated, active, requested, reserved and
    non-releasable bytes, allocations, segments, oversize ones; columns:
    current, peak, total allocated, total freed; per pool unless ``abbreviated``)."""
    summary = _cuda_summary(_index(device), abbreviated)
    for cuda, openreg in _SUMMARY_NAMES:
        summary = summary.replace(cuda, openreg, 1)
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
