"""Streams and events on openreg devices, as torch.cuda.streams.

``torch.openreg.Stream`` and ``torch.openreg.Event`` are ``torch.Stream`` and
``torch.Event`` for the openreg device type, so device-generic code that takes
either works with them. Each stream is an in-order queue on its device:
non-blocking copies (with pinned host memory) and event records run on it
asynchronously; kernels launched while it is current run after the work
queued on it.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_openreg import _C

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
]


def _openreg_device(device: Any) -> torch.device:
    from torch_openreg.openreg import _device_index

    return torch.device("openreg", _device_index(device))


class Stream(torch.Stream):
    """An openreg stream: ``Stream(device=None, priority=0)``.

    ``priority`` is 0 (normal) or negative (high); lower numbers are higher
    priorities, as in CUDA, and values outside ``priority_range()`` are clamped.
    Streams come from a fixed pool per device and priority, as CUDA's do.
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=_openreg_device(device), priority=priority)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest) priority, as torch.cuda.Stream.priority_range."""
        return _C._stream_priority_range()

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.stream_id, self.device_index)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, torch.Stream) and super().__eq__(other)

    def __hash__(self) -> int:
        return hash((self.device_type, self.device_index, self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.openreg.Stream device=openreg:{self.device_index} stream_id={self.stream_id}>"


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


class Event(torch.Event):
    """An openreg event: ``Event(enable_timing=False, blocking=False, interprocess=False)``."""

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Event:
        if interprocess:
            raise NotImplementedError(
                "openreg events cannot be shared between processes: create the event with "
                "interprocess=False."
            )
        return super().__new__(
            cls, device="openreg", enable_timing=enable_timing, blocking=blocking, interprocess=False
        )

    def record(self, stream: torch.Stream | None = None) -> None:
        """Records the event on ``stream`` (default: the current stream)."""
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Makes ``stream`` (default: the current stream) wait for this event."""
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event to ``end_event``; both need ``enable_timing=True``."""
        return _C._event_elapsed_time(self, end_event)

    def __repr__(self) -> str:
        return f"<torch.openreg.Event event_id={self.event_id}>"


def current_stream(device: Any = None) -> Stream:
    """The current stream of ``device`` (default: the current device)."""
    from torch_openreg.openreg import _device_index, _lazy_init

    _lazy_init()
    return _wrap(torch.accelerator.current_stream(_device_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The default stream of ``device`` (default: the current device)."""
    from torch_openreg.openreg import _device_index, _lazy_init

    _lazy_init()
    index = _device_index(device)
    # device_type is torch.Stream's enum value for PrivateUse1; take it from a
    # stream that exists rather than drawing a new one from the pool.
    current = torch.accelerator.current_stream(index)
    return Stream(stream_id=0, device_index=index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` current on its device, for this thread."""
    if stream is None:
        return
    if stream.device.type != "openreg":
        raise ValueError(f"expected an openreg stream, got a stream of {stream.device}")
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes ``stream`` current (and its device current) inside it."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.prev_device: int | None = None
        self.prev_streams: list[torch.Stream] = []

    def __enter__(self) -> torch.Stream | None:
        from torch_openreg.openreg import current_device, set_device

        if self.stream is None:
            return None
        target = self.stream.device_index
        self.prev_device = current_device()
        self.prev_streams = [torch.accelerator.current_stream(self.prev_device)]
        if target != self.prev_device:
            self.prev_streams.append(torch.accelerator.current_stream(target))
            set_device(target)
        try:
            set_stream(self.stream)
        except BaseException:
            # __exit__ does not run when __enter__ raises (an invalid stream id):
            # give the thread its device back here.
            set_device(self.prev_device)
            raise
        return self.stream

    def __exit__(self, *exc: object) -> bool:
        from torch_openreg.openreg import set_device

        if self.stream is None:
            return False
        for s in reversed(self.prev_streams):
            torch.accelerator.set_stream(s)
        set_device(self.prev_device)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    """``with torch.openreg.stream(s):`` runs the block with ``s`` current."""
    return StreamContext(stream)
