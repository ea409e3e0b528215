"""torch.openreg.sanitizer: finds stream synchronisation errors, like torch.cuda._sanitizer.

``TORCH_OPENREG_SANITIZER=1`` (read when torch_openreg is imported) or
:func:`enable` makes every operator on openreg tensors, in the thread that
enabled it and the autograd threads it starts, a checked kernel launch.
Reported, from the order the program establishes (streams, events,
synchronisations), not from what happened to run first:

1. an operator reading or writing memory that another stream wrote (or read,
   for a write) without a wait or synchronisation in between;
2. device memory freed while a stream other than the one it was allocated on
   may still use it, without ``Tensor.record_stream`` for that stream;
3. host code reading the destination of a ``non_blocking=True``
   device-to-host copy before synchronising with the copy's stream.

As CSAN does, each error is printed to stderr and the operator that found it
raises ``torch.cuda._sanitizer.CUDASanitizerErrors``; an error found when
memory is freed is printed then and raised by the next operator. What it
cannot see, and its cost: docs/integration/streams.md, "Sanitizer".
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["disable", "enable", "is_enabled"]

_ENV = "TORCH_OPENREG_SANITIZER"
_active: Any = None  # the _sanitizer.Sanitizer while enabled


def enable() -> None:
    """Starts checking. Enable it before the program's first stream work: accesses
    made before are unknown to it (so nothing is reported about them)."""
    global _active
    if _active is not None:
        return
    # Deferred: importing CSAN activates c10's GPU trace for the rest of the process.
    from torch_openreg.openreg import _sanitizer

    sanitizer = _sanitizer.Sanitizer()
    sanitizer.enable()
    _active = sanitizer


def disable() -> None:
    """Stops checking and forgets what it saw. torch cannot turn the GPU trace off
    again: each stream, event or memory event still calls into Python, to no callback."""
    global _active
    if _active is None:
        return
    sanitizer, _active = _active, None
    sanitizer.disable()


def is_enabled() -> bool:
    return _active is not None


def _apply_environment() -> None:
    """Called at import: TORCH_OPENREG_SANITIZER=1 enables it; 0 or unset does not."""
    value = os.environ.get(_ENV, "").strip()
    if value in ("", "0"):
        return
    if value != "1":
        raise RuntimeError(
            f"{_ENV}={os.environ[_ENV]!r} is not valid: set it to 1 to check openreg's stream "
            "synchronisation (torch.openreg.sanitizer), or to 0 or leave it unset not to."
        )
    enable()
