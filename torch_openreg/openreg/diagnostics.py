"""What the device does: the dispatch trace and the CPU fallback report.

``TORCH_SHOW_DISPATCH_TRACE=1`` prints one line for each call the openreg
backend serves, in PyTorch's trace format followed by how openreg served it
(release wheels of torch print nothing themselves). ``OPENREG_FALLBACK`` sets
what happens when an operator has no openreg kernel and runs on the CPU
fallback: ``silent`` (default), ``warn`` (once per operator) or ``error``.
Both can be changed from Python with the functions below.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from torch_openreg import _C

__all__ = [
    "dispatch_trace",
    "fallback_stats",
    "get_fallback_mode",
    "is_dispatch_trace_enabled",
    "reset_fallback_stats",
    "set_dispatch_trace",
    "set_fallback_mode",
]

_FALLBACK_ENV = "OPENREG_FALLBACK"


def fallback_stats() -> dict[str, int]:
    """``{"aten::op.overload": count}`` of the operators that ran on the CPU
    fallback since the start or since :func:`reset_fallback_stats`."""
    return dict(sorted(_C._fallback_stats().items()))


def reset_fallback_stats() -> None:
    _C._reset_fallback_stats()


def set_fallback_mode(mode: str) -> None:
    """``"silent"``: run fallbacks quietly (they are still counted);
    ``"warn"``: warn the first time each operator falls back;
    ``"error"``: raise NotImplementedError instead of falling back."""
    if not isinstance(mode, str):
        raise TypeError(f"set_fallback_mode expects 'silent', 'warn' or 'error', got {type(mode).__name__}")
    _C._set_fallback_mode(mode)


def get_fallback_mode() -> str:
    return _C._get_fallback_mode()


def set_dispatch_trace(enabled: bool) -> None:
    """Turns the dispatch trace on or off (TORCH_SHOW_DISPATCH_TRACE=1 turns it on at import)."""
    _C._set_dispatch_trace(bool(enabled))


def is_dispatch_trace_enabled() -> bool:
    return _C._is_dispatch_trace_enabled()


@contextlib.contextmanager
def dispatch_trace(enabled: bool = True) -> Iterator[None]:
    """Traces (or, with False, silences) the calls made inside the block."""
    previous = is_dispatch_trace_enabled()
    set_dispatch_trace(enabled)
    try:
        yield
    finally:
        set_dispatch_trace(previous)


def _apply_environment() -> None:
    """Called at import: a malformed OPENREG_FALLBACK fails the import with the reason."""
    value = os.environ.get(_FALLBACK_ENV)
    if value is None or value == "":
        return
    try:
        set_fallback_mode(value.lower())
    except ValueError:
        raise RuntimeError(
            f"{_FALLBACK_ENV}={value!r} is not a fallback mode: use silent, warn or error"
        ) from None
