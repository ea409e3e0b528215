"""torch.openreg: the device module, named and behaving like torch.cuda."""

from __future__ import annotations

import os
from typing import Any

import torch

from torch_openreg import _C

__all__ = [
    "current_device",
    "default_generators",
    "device",
    "device_count",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "synchronize",
]

_initialized = False
_in_bad_fork = False


def _after_fork_in_child() -> None:
    global _in_bad_fork
    if _initialized:
        _in_bad_fork = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _is_in_bad_fork() -> bool:
    """True in a child forked after openreg was initialised in its parent."""
    return _in_bad_fork


def _lazy_init() -> None:
    """Initialises the runtime once; raises in a child forked after initialisation."""
    global _initialized
    if _initialized and not _in_bad_fork:
        return
    if _in_bad_fork:
        raise RuntimeError(
            "Cannot re-initialize openreg in a forked subprocess. To use openreg with "
            "multiprocessing, use the 'spawn' start method "
            "(torch.multiprocessing.set_start_method('spawn'))."
        )
    _C._init()
    _initialized = True


def is_initialized() -> bool:
    return _initialized and not _in_bad_fork


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


def synchronize(device: Any = None) -> None:
    """Waits for all work on ``device`` (default: the current device)."""
    _lazy_init()
    _C._synchronize(_device_index(device))


# -- random numbers ---------------------------------------------------------------

_default_generators: tuple[torch.Generator, ...] | None = None


def _generators() -> tuple[torch.Generator, ...]:
    global _default_generators
    if _default_generators is None:
        _lazy_init()
        _default_generators = tuple(_C._default_generator(i) for i in range(device_count()))
    return _default_generators


class _DefaultGenerators:
    """Sequence view of the per-device default generators, built on first use."""

    def __getitem__(self, index: int) -> torch.Generator:
        return _generators()[index]

    def __len__(self) -> int:
        return len(_generators())

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(_generators())


default_generators = _DefaultGenerators()


def manual_seed(seed: int) -> None:
    """Seeds the current openreg device's generator."""
    default_generators[current_device()].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every openreg device's generator (torch.manual_seed calls this)."""
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic number."""
    default_generators[current_device()].seed()


def seed_all() -> None:
    """Seeds every device's generator with one non-deterministic number."""
    first = default_generators[0].seed()
    for g in list(default_generators)[1:]:
        g.manual_seed(first)


def initial_seed() -> int:
    return default_generators[current_device()].initial_seed()


def get_rng_state(device: Any = "openreg") -> torch.Tensor:
    """The generator state of ``device`` as a CPU ByteTensor."""
    return default_generators[_device_index(device)].get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "openreg") -> None:
    default_generators[_device_index(device)].set_state(
        new_state.clone(memory_format=torch.contiguous_format)
    )


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in default_generators]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    if len(new_states) != device_count():
        raise ValueError(
            f"set_rng_state_all got {len(new_states)} states for {device_count()} openreg devices"
        )
    for i, state in enumerate(new_states):
        set_rng_state(state, i)
