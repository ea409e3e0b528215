"""torch.openreg mirrors torch.cuda; the generated Tensor/Module/Storage methods."""

import os
import threading

import pytest
import torch
from torch.testing import assert_close


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


def test_synchronize_accepts_device_forms():
    torch.openreg.synchronize()
    torch.openreg.synchronize(1)
    torch.openreg.synchronize("openreg:1")


def test_manual_seed_and_initial_seed():
    torch.openreg.manual_seed(42)
    assert torch.openreg.initial_seed() == 42
    torch.openreg.manual_seed_all(7)
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [7, 7]
    torch.manual_seed(11)  # torch seeds every backend, openreg included
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [11, 11]


def test_seed_and_seed_all_are_nondeterministic_but_consistent():
    torch.openreg.seed_all()
    seeds = [g.initial_seed() for g in torch.openreg.default_generators]
    assert seeds[0] == seeds[1]
    torch.openreg.seed()
    assert torch.openreg.initial_seed() != 0


def test_rng_state_round_trip_per_device():
    torch.openreg.manual_seed(3)
    state = torch.openreg.get_rng_state("openreg:0")
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(4, device="openreg:0")
    torch.openreg.set_rng_state(state, "openreg:0")
    assert_close(torch.randn(4, device="openreg:0").cpu(), a.cpu())


def test_rng_state_all_round_trip():
    states = torch.openreg.get_rng_state_all()
    a = [torch.rand(3, device=f"openreg:{i}") for i in range(2)]
    torch.openreg.set_rng_state_all(states)
    b = [torch.rand(3, device=f"openreg:{i}") for i in range(2)]
    for x, y in zip(a, b):
        assert_close(x.cpu(), y.cpu())
    with pytest.raises(ValueError, match="1 states for 2 openreg devices"):
        torch.openreg.set_rng_state_all(states[:1])


def test_default_generators_are_per_device():
    gens = list(torch.openreg.default_generators)
    assert [g.device for g in gens] == [torch.device("openreg:0"), torch.device("openreg:1")]
    assert torch.openreg.default_generators[1] is gens[1]


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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_after_init_marks_child_bad():
    torch.ones(1, device="openreg")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            torch.openreg._lazy_init()
            msg = b"no error"
        except RuntimeError as e:
            msg = str(e).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    data = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    assert "spawn" in data and "forked subprocess" in data


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
