"""torch.accelerator end to end, and the device queries of torch.openreg."""

import pytest
import torch
from torch.testing import assert_close

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)


def test_openreg_is_the_current_accelerator():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("openreg")
    assert torch.accelerator.device_count() == torch.openreg.device_count() == 2


def test_device_index_follows_set_device_index_and_context():
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1 == torch.openreg.current_device()
    assert torch.empty(1, device="openreg").device.index == 1
    with torch.accelerator.device_index(0):
        assert torch.openreg.current_device() == 0
    assert torch.accelerator.current_device_index() == 1


def test_set_device_index_out_of_range_is_a_runtime_error_as_on_cuda():
    with pytest.raises(RuntimeError, match="The device index is out of range: openreg:5.*OPENREG_DEVICE_COUNT"):
        torch.accelerator.set_device_index(5)


def test_streams_through_torch_accelerator():
    s = torch.Stream(device="openreg:1")
    torch.accelerator.set_stream(s)
    try:
        assert torch.accelerator.current_stream(1) == s
        assert torch.accelerator.current_device_index() == 1  # set_stream sets the device too
        x = torch.ones(4, device="openreg:1") * 3
    finally:
        torch.accelerator.set_stream(torch.openreg.default_stream(1))
    torch.accelerator.synchronize(1)
    assert_close(x.cpu(), torch.full((4,), 3.0))


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental", "ignore:Casting complex values to real")
def test_device_capability_lists_the_dtypes_openreg_holds_and_converts():
    supported = torch.accelerator.get_device_capability(0)["supported_dtypes"]
    dtypes = {d for d in vars(torch).values() if isinstance(d, torch.dtype)}
    for dtype in dtypes:
        try:
            torch.empty(4, dtype=dtype, device="openreg").to(torch.float32).to(dtype)
            torch.openreg.synchronize()  # a queued conversion's error (OPENREG_QUEUE_ALL_KERNELS=1)
            converts = True
        except (RuntimeError, TypeError, NotImplementedError):
            converts = False
        assert (dtype in supported) == converts, dtype
    assert {torch.float32, torch.bfloat16, torch.uint64, torch.float8_e4m3fn} <= supported
    assert torch.openreg.get_device_capability(0) == (1, 0)


def test_device_properties_and_name():
    props = torch.openreg.get_device_properties("openreg:1")
    assert props.name == torch.openreg.get_device_name(1) == "openreg simulated device"
    assert props.total_memory > 0 and props.multi_processor_count >= 1
    assert "total_memory=8192MB" in repr(props)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.openreg.get_device_properties(7)


def test_memory_apis_agree_between_torch_accelerator_and_torch_openreg():
    t = torch.empty(1 << 20, dtype=torch.uint8, device="openreg:1")
    assert torch.accelerator.memory_allocated(1) == torch.openreg.memory_allocated(1) > 0
    assert torch.accelerator.memory_reserved(1) == torch.openreg.memory_reserved(1)
    assert torch.accelerator.get_memory_info(1) == torch.openreg.mem_get_info(1)
    del t
    torch.accelerator.empty_cache()
    torch.accelerator.empty_host_cache()


def test_pinned_host_memory_is_cached_and_the_cache_can_be_emptied():
    first = torch.empty(1000, pin_memory=True)
    address = first.data_ptr()
    del first
    second = torch.empty(1000, pin_memory=True)
    assert second.data_ptr() == address  # served from the cache
    del second
    torch.accelerator.empty_host_cache()
    assert torch.empty(1000, pin_memory=True).is_pinned()
