"""torch.openreg: the device module, named and behaving like torch.cuda."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

import torch
from torch.autograd.variable import Variable
from torch.utils._python_dispatch import _disable_current_modes

from torch_openreg import _C

__all__ = [
    "AcceleratorError",
    "OutOfMemoryError",
    "can_device_access_peer",
    "current_device",
    "device",
    "device_count",
    "device_of",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_sync_debug_mode",
    "init",
    "is_available",
    "is_initialized",
    "is_tf32_supported",
    "memory_usage",
    "set_device",
    "set_sync_debug_mode",
    "synchronize",
    "utilization",
]

def _is_in_bad_fork() -> bool:
    """True in a child forked after openreg was initialised in its parent."""
    return _C._is_in_bad_fork()


def _lazy_init() -> None:
    """Initialises openreg once, like torch.cuda._lazy_init.

    Importing the package only validates the configuration; the first use of a
    device initialises it. A child forked after that cannot use openreg.
    """
    if _C._is_initialized() and not _C._is_in_bad_fork():
        return
    _C._init()  # raises the "use the 'spawn' start method" error in a bad fork


def init() -> None:
    """Initialises openreg now rather than at its first use (torch.cuda.init);
    nothing if it is initialised."""
    _lazy_init()


# Raised when a device allocation fails, as torch.cuda.OutOfMemoryError.
OutOfMemoryError = torch.OutOfMemoryError
# torch's error for a failure of the device itself, as torch.cuda.AcceleratorError.
AcceleratorError = torch.AcceleratorError


def is_initialized() -> bool:
    return _C._is_initialized() and not _C._is_in_bad_fork()


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return _C._device_count()


def _device_index(dev: Any, optional: bool = True) -> int:
    """An openreg device index from an int, "openreg:N", torch.device or None."""
    if dev is None:
        if not optional:
            raise ValueError("expected an openreg device, got None")
        return current_device()
    if isinstance(dev, str):
        dev = torch.device(dev)
    if isinstance(dev, torch.device):
        if dev.type != "openreg":
            raise ValueError(f"expected an openreg device, got {dev}")
        return current_device() if dev.index is None else dev.index
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    raise TypeError(f"expected an int, str or torch.device for an openreg device, got {type(dev).__name__}")


def current_device() -> int:
    _lazy_init()
    return _C._get_device()


def set_device(device: Any) -> None:
    """Sets the current openreg device of this thread (int, "openreg:N" or torch.device)."""
    _lazy_init()
    _C._set_device(_device_index(device, optional=False))


class device:
    """Context manager that makes ``device`` the current openreg device, as torch.cuda.device."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else _device_index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx == -1:
            return
        self.prev_idx = current_device()
        if self.prev_idx != self.idx:
            set_device(self.idx)

    def __exit__(self, *exc: object) -> bool:
        if self.idx != -1 and self.prev_idx != self.idx:
            set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of ``obj`` (a tensor or storage) the
    current openreg device, as torch.cuda.device_of; nothing for another device's."""

    def __init__(self, obj: Any) -> None:
        super().__init__(obj.device.index if obj.device.type == "openreg" else None)


class _DeviceProperties:
    """What torch.openreg.get_device_properties returns (fields as torch.cuda's)."""

    def __init__(self, props: dict[str, Any]) -> None:
        self.name: str = props["name"]
        self.total_memory: int = props["total_memory"]
        self.major: int = props["major"]
        self.minor: int = props["minor"]
        self.multi_processor_count: int = props["multi_processor_count"]

    def __repr__(self) -> str:
        return (
            f"_OpenRegDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


def get_device_properties(device: Any = None) -> _DeviceProperties:
    """Name, total memory and capability of ``device`` (default: the current device)."""
    _lazy_init()
    return _DeviceProperties(_C._get_device_properties(_device_index(device)))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    props = get_device_properties(device)
    return props.major, props.minor


def _sleep(ms: float) -> None:
    """Keeps the current stream busy for ``ms`` milliseconds (for tests, like torch.cuda._sleep)."""
    _lazy_init()
    _C._sleep(float(ms))


def synchronize(device: Any = None) -> None:
    """Waits for all work on ``device`` (default: the current device)."""
    _lazy_init()
    _C._synchronize(_device_index(device))


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """Whether kernels on ``device`` can read ``peer_device``'s memory, as
    torch.cuda.can_device_access_peer: always, for two openreg devices of
    this process (the runtime copies between any two)."""
    _lazy_init()
    for index in (_device_index(device), _device_index(peer_device, optional=False)):
        _C._validate_device_index(index)
    return True


# torch's autograd engine runs a backward's device work on a thread per device index
# (pt_autograd_<index>), which may drop the backward's GraphTask after backward() has
# returned. Every GraphTask holds Python objects (torch.autograd.backward stores a
# contextvars.Context in the thread-local state it captures; FSDP2's callbacks), and
# dropping them takes the GIL: once the interpreter finalises, Python ends a thread
# that asks for it with pthread_exit, whose unwinding through torch's noexcept frames
# aborts the process ("terminate called without an active exception"). Before that,
# a backward on each such device returns only once its thread is done with every
# earlier one; run through the engine itself, it captures no Python object, and its
# tensors stay referenced here.
_SETTLED: list[torch.Tensor] = []


@atexit.register
def _settle_autograd_threads() -> None:
    if not _C._is_initialized() or _C._is_in_bad_fork():
        return
    prefix, tasks = "pt_autograd_", Path("/proc/self/task")
    names = []
    for task in tasks.iterdir() if tasks.is_dir() else ():  # Linux only
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    indices = {int(name[len(prefix):]) for name in names if name.startswith(prefix) and name[len(prefix):].isdigit()}
    # Torch function modes (torch.set_default_device's) are Python objects too.
    modes = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    try:
        for index in sorted(i for i in indices if i < device_count()):
            try:
                with torch.enable_grad(), _disable_current_modes():
                    leaf = torch.ones((), device=f"openreg:{index}", requires_grad=True)
                    loss = leaf * 2
                    Variable._execution_engine.run_backward((loss,), (torch.ones_like(loss),), False, False, (),
                                                            True, True)
                _SETTLED.extend((leaf, loss, leaf.grad))
            except Exception:  # a device left faulted: nothing to settle on it
                pass
    finally:
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """Warns (``"warn"`` or 1) or raises (``"error"`` or 2) on each operation that
    makes the host wait for the device, as torch.cuda.set_sync_debug_mode: a
    copy between the host and openreg that is not non_blocking, ``.item()``
    (and so printing, ``.tolist()``), an operator whose result's shape depends
    on the device's values (nonzero, masked_select, unique...) and
    ``Stream.synchronize()``; ``"default"`` or 0 turns it off. An explicit
    ``synchronize()`` or ``Event.synchronize()`` is never reported."""
    _lazy_init()
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    _C._set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    """The mode set_sync_debug_mode set: 0 (default), 1 (warn) or 2 (error)."""
    _lazy_init()
    return _C._get_sync_debug_mode()


def utilization(device: Any = None) -> int:
    """The percent of the last second during which a kernel ran on ``device``, as
    torch.cuda.utilization reads it from nvidia-smi. The runtime samples the
    device's streams every millisecond from the first call of utilization or
    memory_usage on (so the first call answers 0, and the period is shorter than
    a second until one has passed). Kernels (queued, or run at once by the
    launching thread) and host functions queued on a stream count
    (torch.openreg._sleep's wait is one); copies count for memory_usage only."""
    _lazy_init()
    return _C._utilization(_device_index(device))[0]


def memory_usage(device: Any = None) -> int:
    """The percent of the last second during which ``device``'s memory was read or
    written (by a kernel or a copy queued on its streams), as torch.cuda.memory_usage
    reads it from nvidia-smi; sampled as utilization() is."""
    _lazy_init()
    return _C._utilization(_device_index(device))[1]


def is_tf32_supported() -> bool:
    """False: openreg's matrix products run CPU kernels in full float32; there is no TF32."""
    return False


# Imported last: they use the device functions above.
from torch_openreg.openreg import amp, diagnostics, memory, random, sanitizer, streams, formats  # noqa: E402
from torch_openreg.openreg.amp import get_amp_supported_dtype, is_bf16_supported  # noqa: E402,F401
from torch_openreg.openreg.diagnostics import *  # noqa: E402,F401,F403
from torch_openreg.openreg.memory import *  # noqa: E402,F401,F403
from torch_openreg.openreg.random import *  # noqa: E402,F401,F403
from torch_openreg.openreg.streams import *  # noqa: E402,F401,F403
from torch_openreg.openreg.formats import *  # noqa: E402,F401,F403
from torch_openreg.openreg import graphs  # noqa: E402
from torch_openreg.openreg.graphs import *  # noqa: E402,F401,F403

__all__ += ["amp", "get_amp_supported_dtype", "is_bf16_supported", "sanitizer"]
__all__ += diagnostics.__all__ + memory.__all__ + random.__all__ + streams.__all__ + formats.__all__ + ["graphs"] + graphs.__all__

diagnostics._apply_environment()

# torch.openreg.FloatStorage and its kind, which Tensor.storage_type() returns; named
# from torch.openreg, as torch.cuda.FloatStorage is (TypedStorage.type(), pickles).
from torch_openreg.openreg._storage import legacy_storage_classes  # noqa: E402

globals().update(legacy_storage_classes("torch.openreg"))

# torch.multiprocessing shares openreg tensors as CUDA IPC shares CUDA ones (ipc.py).
from torch_openreg.openreg import ipc  # noqa: E402
from torch_openreg.openreg.ipc import ipc_collect  # noqa: E402,F401

ipc.register()
__all__ += ["ipc_collect"]

if torch.distributed.is_available():
    # init_process_group() picks openreg_gloo for openreg tensors (docs/integration/distributed.md).
    from torch_openreg.openreg import distributed  # noqa: E402

    distributed._register_backend()
    __all__ += ["distributed"]

# Last: the sanitizer's mode sees what runs from here on.
sanitizer._apply_environment()
