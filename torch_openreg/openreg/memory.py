"""Device memory of openreg, as torch.cuda.memory.

The numbers come from openreg's caching allocator through the device-generic
``torch.accelerator`` memory API, so both report the same values. Each device
has ``OPENREG_DEVICE_MEMORY`` bytes (default 8G); beyond that, allocation
raises ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

__all__ = [
    "empty_cache",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
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
