"""Random number generation on openreg devices, as torch.cuda.random."""

from __future__ import annotations

from typing import Any

import torch

from torch_openreg import _C
from torch_openreg.openreg import _device_index, _lazy_init, current_device, device_count

__all__ = [
    "default_generators",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]

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
