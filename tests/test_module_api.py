"""torch.openreg mirrors torch.cuda; the generated Tensor/Module/Storage methods."""

import threading

import pytest
import torch

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)


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


def _cuda_public_names() -> set[str]:
    """torch.cuda's public names: its __all__, its submodules and its exception classes
    (dir() also lists what it imports: os, typing helpers...)."""
    import types

    names = set(torch.cuda.__all__)
    for name in dir(torch.cuda):
        value = getattr(torch.cuda, name)
        if name.startswith("_"):
            continue
        if isinstance(value, types.ModuleType) and value.__name__.startswith("torch.cuda."):
            names.add(name)
        elif isinstance(value, type) and issubclass(value, Exception):
            names.add(name)
    return names


def _names_documented_as_not_applying() -> set[str]:
    """The names in docs/integration/device.md's table "torch.cuda's names"."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parent.parent / "docs" / "integration" / "device.md").read_text()
    section = text.split("# torch.cuda's names\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "docs/integration/device.md lost its table of torch.cuda's names"
    return {name for row in rows for name in re.findall(r"`([A-Za-z_0-9]+)`", row.split(" | ")[0])}


def test_every_public_name_of_torch_cuda_is_in_torch_openreg_or_documented_as_not_applying():
    cuda = _cuda_public_names()
    documented = _names_documented_as_not_applying()
    missing = sorted(n for n in cuda if not hasattr(torch.openreg, n) and n not in documented)
    assert not missing, f"torch.cuda names neither in torch.openreg nor in docs/integration/device.md's table: {missing}"
    stale = sorted(n for n in documented if n not in cuda or hasattr(torch.openreg, n))
    assert not stale, f"docs/integration/device.md lists names torch.openreg has, or torch.cuda no longer has: {stale}"


def test_namesakes_answer_as_torch_cuda_s_would():
    assert torch.openreg.AcceleratorError is torch.AcceleratorError
    assert torch.openreg.can_device_access_peer(0, 1) and torch.openreg.can_device_access_peer("openreg:1", 0)
    with pytest.raises(RuntimeError, match="device index is out of range: openreg:5"):
        torch.openreg.can_device_access_peer(0, 5)
    assert torch.openreg.is_current_stream_capturing() is False
    assert torch.openreg.is_tf32_supported() is False
    assert torch.openreg.get_allocator_backend() == "native"


UTILIZATION = """
    import time, torch
    assert torch.openreg.utilization(1) == 0  # the first call starts the sampling
    def until(condition, what):
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, what + f": {torch.openreg.utilization(1)}% kernel, " \\
                f"{torch.openreg.memory_usage(1)}% memory"
            time.sleep(0.05)
    with torch.openreg.device(1):
        torch.openreg._sleep(600)  # a host function holding the stream: a kernel, no memory traffic
        torch.openreg.synchronize()
    assert torch.openreg.utilization(1) >= 50, torch.openreg.utilization(1)
    assert torch.openreg.memory_usage(1) <= 10, torch.openreg.memory_usage(1)
    assert torch.openreg.utilization(0) <= 10, torch.openreg.utilization(0)  # per device
    until(lambda: torch.openreg.utilization(1) == 0, "idle device still busy after the sampled second")
    x = torch.ones(1 << 24, device="openreg:1")
    start = time.monotonic()
    while time.monotonic() - start < 1.5:  # longer than the sampled second
        for _ in range(10):
            x.mul_(1.0)  # 16M elements: queued on the stream's worker
        torch.openreg.synchronize(1)
    assert torch.openreg.utilization(1) >= 50, torch.openreg.utilization(1)
    assert torch.openreg.memory_usage(1) >= 50, torch.openreg.memory_usage(1)
"""


@pytest.mark.exclusive  # the busy fractions are of wall time
def test_utilization_and_memory_usage_sample_what_the_streams_run():
    import subprocess
    import sys
    import textwrap

    result = subprocess.run([sys.executable, "-c", textwrap.dedent(UTILIZATION)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
