"""Pinned host memory through the PrivateUse1 hooks."""

import pytest
import torch
from torch.testing import assert_close

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)


def test_pin_memory_and_is_pinned():
    t = torch.arange(6.0)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned()
    assert_close(p, t)
    assert torch.empty(3, pin_memory=True).is_pinned()


def test_non_blocking_device_to_host_copy_lands_in_pinned_memory():
    x = torch.randn(5, device="openreg")
    y = x.to("cpu", non_blocking=True)
    torch.openreg.synchronize()
    assert y.is_pinned()
    assert_close(y, x.cpu())


def test_pinned_host_to_device_copy():
    p = torch.arange(4.0).pin_memory()
    assert_close(p.to("openreg", non_blocking=True).cpu(), torch.arange(4.0))


def test_dataloader_pin_memory():
    data = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True)
    batches = [b for (b,) in loader]
    assert all(b.is_pinned() for b in batches)
    assert_close(torch.cat(batches), torch.arange(8.0).reshape(4, 2))


def test_pinning_a_device_tensor_is_refused():
    with pytest.raises((RuntimeError, NotImplementedError), match="pinned"):
        torch.ones(2, device="openreg").pin_memory()
