"""Mixed precision on openreg, named like ``torch.cuda.amp``.

``torch.autocast("openreg", dtype=...)`` and ``torch.amp.GradScaler("openreg")`` are the
device-generic spellings; these are the same objects with the device filled in. The
operator policy (which operators run in the lower precision, which in float32, which
promote) is CUDA's, registered for the device in ``csrc/amp/OpenRegAutocast.cpp``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["autocast", "GradScaler", "get_amp_supported_dtype", "is_bf16_supported"]


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("openreg", dtype=...)`` accepts; any other dtype
    makes autocast warn and stay disabled, as on CUDA."""
    return [torch.float16, torch.bfloat16]


def is_bf16_supported() -> bool:
    """Whether the device computes in bfloat16 (it always does: its kernels are CPU's)."""
    return True


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("openreg", ...)``: ``with torch.openreg.amp.autocast(dtype=torch.bfloat16):``.
    The default dtype is float16, as for ``torch.cuda.amp.autocast``."""

    def __init__(
        self,
        enabled: bool = True,
        dtype: torch.dtype = torch.float16,
        cache_enabled: bool = True,
    ) -> None:
        super().__init__("openreg", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("openreg", ...)``: scales the loss so float16 gradients do
    not underflow, unscales them before the optimizer step and skips steps whose
    gradients hold inf or NaN."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("openreg", *args, **kwargs)
