"""torch.openreg.set_sync_debug_mode: operations that make the host wait for
the device warn or raise, as on CUDA (c10/cuda/CUDAFunctions.h: memcpy_and_sync,
stream_synchronize); the rest, and explicit synchronisation, never do.

The suite also runs with OPENREG_LAUNCH_BLOCKING=1, where every kernel has run
before its call returns: the same operations are reported, since what matters
is what the program would do on an asynchronous device."""

import warnings

import pytest
import torch

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

MESSAGE = "called a synchronizing openreg operation"


@pytest.fixture
def mode():
    yield torch.openreg.set_sync_debug_mode
    torch.openreg.set_sync_debug_mode("default")


def x():
    return torch.arange(8.0, device="openreg")


SYNCHRONIZING = {
    "item": lambda: x().sum().item(),
    "tolist": lambda: x().tolist(),
    "cpu": lambda: x().cpu(),
    "from_host": lambda: torch.ones(3).to("openreg"),
    "copy_to_host": lambda: torch.empty(8).copy_(x()),
    "nonzero": lambda: x().nonzero(),
    "masked_select": lambda: x()[x() > 3],
    "unique": lambda: torch.unique(x()),
    "stream_synchronize": lambda: torch.openreg.current_stream().synchronize(),
}

ASYNCHRONOUS = {
    "kernels": lambda: (x() * 2 + 1).sum(),
    "copy_between_devices": lambda: x().to("openreg:1"),
    "non_blocking_to_pinned_host": lambda: x().to("cpu", non_blocking=True),
    "non_blocking_from_pinned_host": lambda: torch.ones(3).pin_memory().to("openreg", non_blocking=True),
    "synchronize": lambda: torch.openreg.synchronize(),
    "event_synchronize": lambda: torch.openreg.current_stream().record_event().synchronize(),
}


def test_the_mode_is_off_by_default_and_takes_names_or_numbers(mode):
    assert torch.openreg.get_sync_debug_mode() == 0
    for value, number in (("warn", 1), ("error", 2), ("default", 0), (2, 2), (1, 1), (0, 0)):
        mode(value)
        assert torch.openreg.get_sync_debug_mode() == number
    with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`"):
        mode("loud")
    with pytest.raises(ValueError, match=r"invalid sync debug mode 3: 0 \(default\), 1 \(warn\) or 2 \(error\)"):
        mode(3)
    assert torch.openreg.get_sync_debug_mode() == 0


@pytest.mark.parametrize("name", SYNCHRONIZING)
def test_operations_that_wait_for_the_device_warn(mode, name):
    operation = SYNCHRONIZING[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        operation()
    assert not any(MESSAGE in str(w.message) for w in caught), "reported while the mode was off"
    mode("warn")
    with pytest.warns(UserWarning, match=MESSAGE):
        operation()


@pytest.mark.parametrize("name", SYNCHRONIZING)
def test_operations_that_wait_for_the_device_raise_and_the_device_keeps_working(mode, name):
    operand = x()
    torch.openreg.synchronize()
    mode("error")
    with pytest.raises(RuntimeError, match=MESSAGE):
        SYNCHRONIZING[name]()
    mode("default")
    assert (operand * 2).sum().item() == 56.0


@pytest.mark.parametrize("name", ASYNCHRONOUS)
def test_asynchronous_operations_and_explicit_synchronisation_are_not_reported(mode, name):
    mode("error")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ASYNCHRONOUS[name]()
    assert not any(MESSAGE in str(w.message) for w in caught)
