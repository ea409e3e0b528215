"""torch.openreg mirrors torch.cuda; the generated Tensor/Module/Storage methods."""

import threading

import pytest
import torch


def test_registered_as_torch_openreg_and_privateuse1_renamed():
    import torch_openreg.openreg

    assert torch.openreg is torch_openreg.openreg
    assert torch._C._get_privateuse1_backend_name() == "openreg"
    assert torch.device("openreg").type == "openreg"


def test_availability_and_count():
    assert torch.openreg.is_available()
    assert torch.openreg.device_count() == 2
    torch.openreg._lazy_init()
    assert torch.openreg.is_initialized()
    assert not torch.openreg._is_in_bad_fork()


def test_set_device_and_current_device():
    torch.openreg.set_device(1)
    assert torch.openreg.current_device() == 1
    assert torch.empty(1, device="openreg").device.index == 1
    torch.openreg.set_device("openreg:0")
    assert torch.openreg.current_device() == 0
    torch.openreg.set_device(torch.device("openreg", 1))
    assert torch.openreg.current_device() == 1


def test_set_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="expected an openreg device"):
        torch.openreg.set_device("cpu")


def test_device_context_manager_restores():
    assert torch.openreg.current_device() == 0
    with torch.openreg.device(1):
        assert torch.openreg.current_device() == 1
        with torch.openreg.device("openreg:0"):
            assert torch.openreg.current_device() == 0
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 0
    with torch.openreg.device(None):
        assert torch.openreg.current_device() == 0


def test_device_of_takes_the_device_of_a_tensor_or_storage():
    # As torch.cuda.device_of: the object's device while inside, a no-op for
    # another device type's object.
    torch.openreg.set_device(0)
    t = torch.ones(2, device="openreg:1")
    for obj in (t, t.untyped_storage()):
        with torch.openreg.device_of(obj):
            assert torch.openreg.current_device() == 1
        assert torch.openreg.current_device() == 0
    with torch.openreg.device_of(torch.ones(2)):
        assert torch.openreg.current_device() == 0


def test_init_and_out_of_memory_error_are_torch_cuda_s():
    torch.openreg.init()
    assert torch.openreg.is_initialized()
    assert torch.openreg.OutOfMemoryError is torch.cuda.OutOfMemoryError


def test_synchronize_accepts_device_forms():
    torch.openreg.synchronize()
    torch.openreg.synchronize(1)
    torch.openreg.synchronize("openreg:1")


def test_generated_tensor_methods():
    t = torch.ones(2)
    d = t.openreg()
    assert d.is_openreg and not t.is_openreg
    assert t.openreg(1).device == torch.device("openreg:1")


def test_generated_module_method():
    m = torch.nn.Linear(2, 2).openreg()
    assert all(p.device.type == "openreg" for p in m.parameters())


def test_generated_storage_method():
    s = torch.ones(3).untyped_storage().openreg()
    assert s.device.type == "openreg" and s.is_openreg


def test_allocator_stats_reach_torch_accelerator():
    assert torch.accelerator.current_accelerator() == torch.device("openreg")
    before = torch.accelerator.memory_allocated(0)
    t = torch.empty(1024, dtype=torch.uint8, device="openreg:0")
    assert torch.accelerator.memory_allocated(0) == before + 1024
    del t
    assert torch.accelerator.memory_allocated(0) == before


def test_current_device_is_per_thread():
    torch.openreg.set_device(1)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.openreg.current_device()))
    thread.start()
    thread.join()
    assert seen == [0] and torch.openreg.current_device() == 1


def test_peak_and_accumulated_stats_reset_through_torch_accelerator():
    t = torch.empty(4096, dtype=torch.uint8, device="openreg:1")
    torch.accelerator.reset_peak_memory_stats(1)
    peak = torch.accelerator.max_memory_allocated(1)
    assert peak == torch.accelerator.memory_allocated(1) >= 4096
    del t
    assert torch.accelerator.max_memory_allocated(1) == peak  # peak survives the free
    torch.accelerator.reset_peak_memory_stats(1)
    assert torch.accelerator.max_memory_allocated(1) == torch.accelerator.memory_allocated(1)
    torch.accelerator.reset_accumulated_memory_stats(1)
    assert torch.accelerator.memory_stats(1)["allocation.all.allocated"] == 0
