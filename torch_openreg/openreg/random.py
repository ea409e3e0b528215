"""Random number generation on openreg devices, as ``torch.cuda.random``.

Each openreg device has one default generator, ``default_generators[i]``. A random
operator on a tensor of ``openreg:i`` draws from it unless it is given a
``generator=``, which must then be an openreg generator (``torch.Generator(device=
"openreg:i")``). ``torch.manual_seed`` and ``torch.seed`` reach this module through
``manual_seed_all`` (``torch.random._seed_custom_device``), and
``torch.random.fork_rng(device_type="openreg")`` through ``get_rng_state`` /
``set_rng_state`` (``torch.get_device_module``).

As on CUDA, the functions that *set* generator state (``manual_seed*``, ``seed*``,
``set_rng_state*``) do not initialise openreg: torch.cuda defers them until
initialisation (``torch.cuda._lazy_call``), and here the generators exist from
import, so setting their state needs no initialisation. Hence ``torch.manual_seed``
alone does not make ``torch.openreg.is_initialized()`` true. In a child forked after
openreg was initialised they do nothing, as torch.cuda's deferred calls never run
there. The functions that *read* state (``get_rng_state*``, ``initial_seed``)
initialise openreg, as torch.cuda's do, and so raise in such a child.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, overload

import torch

from torch_openreg import _C
from torch_openreg.openreg import _is_in_bad_fork, _lazy_init, device_count

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
    # The C++ generators (csrc/device/OpenRegGenerator.cpp) exist once per device;
    # caching their Python wrappers keeps `default_generators[i] is
    # default_generators[i]`, as torch.cuda.default_generators does.
    global _default_generators
    if _default_generators is None:
        _default_generators = tuple(_C._default_generator(i) for i in range(device_count()))
    return _default_generators


class _DefaultGenerators(Sequence):
    """The default generator of each openreg device, indexed by device index.

    A read-only sequence like the tuple ``torch.cuda.default_generators``, whose
    Python objects are built on first use.
    """

    @overload
    def __getitem__(self, index: int) -> torch.Generator: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[torch.Generator, ...]: ...

    def __getitem__(self, index: int | slice) -> torch.Generator | tuple[torch.Generator, ...]:
        return _generators()[index]

    def __len__(self) -> int:
        return device_count()

    def __repr__(self) -> str:
        return f"openreg default_generators({', '.join(str(g.device) for g in self)})"


default_generators = _DefaultGenerators()


def _index_of(device: int | str | torch.device) -> int:
    """The device index that ``device`` names, validated against the device count.

    Unlike ``torch.openreg._device_index``, an index-less ``"openreg"`` resolves to
    the current device without initialising openreg, so that the setters below
    stay initialisation-free.
    """
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("openreg", device)  # rejects negative indices
    elif isinstance(device, str):
        device = torch.device(device)
    elif not isinstance(device, torch.device):
        raise TypeError(
            f"expected an int, 'openreg:N' or torch.device for an openreg device, got {type(device).__name__}"
        )
    if device.type != "openreg":
        raise ValueError(f"expected an openreg device, got {device}")
    index = _C._get_device() if device.index is None else device.index
    _C._validate_device_index(index)
    return index


def _skipped_in_bad_fork(setter: Callable[..., None]) -> Callable[..., None]:
    """Makes a state setter do nothing in a child forked after openreg was initialised.

    torch.cuda's setters are deferred (``_lazy_call``) until an initialisation that
    never happens in such a child, so there they do nothing and raise nothing.
    """

    @functools.wraps(setter)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        if not _is_in_bad_fork():
            setter(*args, **kwargs)

    return wrapper


def get_rng_state(device: int | str | torch.device = "openreg") -> torch.Tensor:
    """Returns the generator state of an openreg device as a CPU ``torch.uint8`` tensor.

    Args:
        device: an index, ``"openreg:N"`` or ``torch.device``. Default ``"openreg"``:
            the current device.

    As ``torch.cuda``'s, 16 bytes: the seed (uint64) and the offset (int64), here the
    position in the seed's CPU (Mersenne Twister) stream in pairs of draws, an odd
    draw in bit 62; DTensor's RNG tracker moves it to place each shard's draws. While
    the generator holds a cached normal sample (CPU's ``normal_`` of an odd number of
    values below 16), or after :func:`set_rng_state` of a CPU generator's state, it is
    the CPU generator's state instead. The result is a copy: later draws do not change it.
    Like ``torch.cuda``, this initialises openreg.
    """
    _lazy_init()
    return default_generators[_index_of(device)].get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    """Returns the generator state of every openreg device, in device order."""
    return [get_rng_state(i) for i in range(device_count())]


@_skipped_in_bad_fork
def set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "openreg") -> None:
    """Sets the generator state of an openreg device.

    Args:
        new_state: a state returned by :func:`get_rng_state` (a CPU ``torch.uint8``
            tensor), with any offset, or a CPU generator's state; it is copied, so
            changing it later has no effect.
        device: an index, ``"openreg:N"`` or ``torch.device``. Default ``"openreg"``:
            the current device.
    """
    index = _index_of(device)
    # The CPU generator reads the state's bytes in order: make them contiguous.
    default_generators[index].set_state(new_state.clone(memory_format=torch.contiguous_format))


@_skipped_in_bad_fork
def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Sets the generator state of every openreg device, one state per device in order.

    Unlike ``torch.cuda.set_rng_state_all``, which silently sets a prefix when given
    fewer states than devices, a count that differs from the device count raises
    ``ValueError``: such states were saved with another device configuration.
    """
    states = list(new_states)
    if len(states) != device_count():
        raise ValueError(
            f"set_rng_state_all got {len(states)} states for {device_count()} openreg devices"
        )
    for index, state in enumerate(states):
        set_rng_state(state, index)


@_skipped_in_bad_fork
def manual_seed(seed: int) -> None:
    """Seeds the generator of the current openreg device.

    With several devices this is not enough for reproducibility: use
    :func:`manual_seed_all` (or ``torch.manual_seed``) to seed them all.
    """
    default_generators[_C._get_device()].manual_seed(int(seed))


@_skipped_in_bad_fork
def manual_seed_all(seed: int) -> None:
    """Seeds the generator of every openreg device (``torch.manual_seed`` calls this)."""
    seed = int(seed)
    for generator in default_generators:
        generator.manual_seed(seed)


@_skipped_in_bad_fork
def seed() -> None:
    """Seeds the current openreg device's generator with a non-deterministic number."""
    default_generators[_C._get_device()].seed()


@_skipped_in_bad_fork
def seed_all() -> None:
    """Seeds every openreg device's generator with one and the same non-deterministic number."""
    first, *others = default_generators
    first.seed()
    for generator in others:
        generator.manual_seed(first.initial_seed())


def initial_seed() -> int:
    """Returns the seed of the current openreg device's generator.

    Like ``torch.cuda``, this initialises openreg.
    """
    _lazy_init()
    return default_generators[_C._get_device()].initial_seed()
