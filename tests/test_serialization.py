"""torch.save / torch.load of openreg tensors, modules and optimizers, as on CUDA:
values, dtypes, views and devices survive; map_location remaps; a device the loading
process lacks is an error that points to map_location."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

TIMEOUT = 60  # seconds, for the subprocess; it normally takes a few
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def round_trip(obj, tmp_path, **load_kwargs):
    """torch.save to a file, then torch.load (weights_only defaults to True)."""
    path = tmp_path / "checkpoint.pt"
    torch.save(obj, path)
    return torch.load(path, **load_kwargs)


def cpu_values(dtype):
    """A 2x3 CPU tensor of `dtype` with distinct values where the dtype allows."""
    values = torch.tensor([[0.0, 1.5, -2.0], [3.25, 0.0, 7.0]])
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return values.to(dtype)


def assert_same(actual, expected_cpu, device):
    assert actual.device == torch.device(device)
    assert actual.dtype == expected_cpu.dtype
    assert torch.equal(actual.cpu(), expected_cpu)


# --- tensors -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_round_trip_keeps_values_dtype_and_device(tmp_path, dtype):
    expected = cpu_values(dtype)
    assert_same(round_trip(expected.to("openreg:1"), tmp_path), expected, "openreg:1")


def test_zero_size_and_zero_dim_tensors_round_trip(tmp_path):
    loaded = round_trip([torch.empty(0, 3, device="openreg"), torch.tensor(2.5, device="openreg:1")], tmp_path)
    assert loaded[0].shape == (0, 3) and loaded[0].device == torch.device("openreg:0")
    assert loaded[1].dim() == 0 and loaded[1].item() == 2.5 and loaded[1].device == torch.device("openreg:1")


def test_views_saved_together_still_share_one_storage(tmp_path):
    base = torch.arange(12.0, device="openreg:1").reshape(3, 4)
    loaded = round_trip({"base": base, "row": base[1], "cols": base[:, 1:3], "t": base.t()}, tmp_path)
    new_base = loaded["base"]
    for name in ("row", "cols", "t"):
        view = loaded[name]
        assert view.untyped_storage().data_ptr() == new_base.untyped_storage().data_ptr()
        assert view.device == torch.device("openreg:1")
    assert loaded["row"].storage_offset() == 4 and loaded["cols"].stride() == (4, 1)
    loaded["row"].fill_(-1.0)  # writes through to the base, as before saving
    expected = torch.arange(12.0).reshape(3, 4)
    expected[1] = -1.0
    assert torch.equal(new_base.cpu(), expected)
    assert torch.equal(loaded["t"].cpu(), expected.t())


def test_a_view_saved_alone_keeps_its_whole_storage_like_cpu(tmp_path):
    # torch.save writes the whole storage of a view; CPU is the oracle.
    base_cpu = torch.arange(10.0)
    view = base_cpu.to("openreg")[2:5]
    loaded = round_trip(view, tmp_path)
    loaded_cpu = round_trip(base_cpu[2:5], tmp_path)
    assert torch.equal(loaded.cpu(), loaded_cpu)
    assert loaded.storage_offset() == loaded_cpu.storage_offset() == 2
    assert loaded.untyped_storage().nbytes() == loaded_cpu.untyped_storage().nbytes() == 40


@pytest.mark.parametrize(
    "make",
    [lambda x: x.t(), lambda x: x[:, ::2], lambda x: x.unsqueeze(1).expand(4, 3, 6), lambda x: x[1:, 1:]],
    ids=["transposed", "step", "expanded", "offset"],
)
def test_non_contiguous_tensor_keeps_strides_offset_and_values(tmp_path, make):
    source = make(torch.arange(24.0).reshape(4, 6).to("openreg"))
    expected = make(torch.arange(24.0).reshape(4, 6))
    loaded = round_trip(source, tmp_path)
    assert not loaded.is_contiguous()
    assert (loaded.stride(), loaded.storage_offset()) == (source.stride(), source.storage_offset())
    assert_same(loaded, expected, "openreg:0")


def test_parameter_round_trip_stays_a_parameter_that_requires_grad(tmp_path):
    loaded = round_trip(nn.Parameter(torch.ones(2, device="openreg:1")), tmp_path)
    assert isinstance(loaded, nn.Parameter) and loaded.requires_grad
    assert loaded.device == torch.device("openreg:1")


def test_storage_round_trip_like_cpu(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "TypedStorage is deprecated" for CPU and openreg alike
        loaded = round_trip(torch.arange(6.0, device="openreg:1").untyped_storage(), tmp_path)
        loaded_cpu = round_trip(torch.arange(6.0).untyped_storage(), tmp_path)
        assert type(loaded) is type(loaded_cpu)
        assert loaded.device == torch.device("openreg:1")
        assert loaded.cpu().tolist() == loaded_cpu.tolist() and len(loaded_cpu) == 24


def test_legacy_and_mmap_formats_load_openreg_tensors(tmp_path):
    source = torch.arange(5.0, device="openreg:1")
    legacy = tmp_path / "legacy.pt"
    torch.save(source, legacy, _use_new_zipfile_serialization=False)
    assert_same(torch.load(legacy), torch.arange(5.0), "openreg:1")
    current = tmp_path / "current.pt"
    torch.save(source, current)
    assert_same(torch.load(current, mmap=True), torch.arange(5.0), "openreg:1")


# --- map_location ------------------------------------------------------------------


@pytest.mark.parametrize(
    "map_location, device",
    [
        ("cpu", "cpu"),
        (torch.device("cpu"), "cpu"),
        ("openreg:0", "openreg:0"),
        (torch.device("openreg", 0), "openreg:0"),
        ({"openreg:1": "openreg:0"}, "openreg:0"),
        ({"openreg:1": "cpu"}, "cpu"),
        ({"openreg:0": "cpu"}, "openreg:1"),  # tags not in the dict load where they were saved
        (lambda storage, location: storage, "cpu"),  # a callable gets the CPU storage
        (lambda storage, location: storage.openreg(0), "openreg:0"),
        (lambda storage, location: None, "openreg:1"),  # None: default restore
    ],
    ids=["str-cpu", "device-cpu", "str-openreg", "device-openreg", "dict", "dict-cpu", "dict-miss",
         "callable-cpu", "callable-openreg", "callable-none"],
)
def test_map_location_forms_place_tensors_like_cuda(tmp_path, map_location, device):
    expected = torch.arange(6.0).reshape(2, 3)
    assert_same(round_trip(expected.to("openreg:1"), tmp_path, map_location=map_location), expected, device)


def test_callable_map_location_sees_the_openreg_location_tag(tmp_path):
    seen = []
    round_trip([torch.ones(1, device="openreg:1"), torch.ones(1, device="openreg:0")], tmp_path,
               map_location=lambda storage, location: seen.append(location))
    assert sorted(seen) == ["openreg:0", "openreg:1"]


def test_map_location_openreg_without_index_means_the_current_device(tmp_path):
    torch.openreg.set_device(1)
    loaded = round_trip(torch.ones(2, device="openreg:0"), tmp_path, map_location="openreg")
    assert loaded.device == torch.device("openreg:1")


def test_cpu_checkpoint_loads_onto_openreg_with_map_location(tmp_path):
    expected = cpu_values(torch.float32)
    assert_same(round_trip(expected, tmp_path, map_location="openreg:1"), expected, "openreg:1")
    assert_same(round_trip(expected, tmp_path, map_location={"cpu": "openreg:1"}), expected, "openreg:1")


def test_map_location_to_a_missing_device_raises_and_suggests_map_location(tmp_path):
    with pytest.raises(
        RuntimeError,
        match=r"deserialize object on OPENREG device 5 but torch.openreg.device_count\(\) is 2. "
        r"Please use torch.load with map_location",
    ):
        round_trip(torch.ones(1, device="openreg"), tmp_path, map_location="openreg:5")


LOAD_WITH_ONE_DEVICE = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch_openreg

    path = sys.argv[1]
    result = {"device_count": torch.openreg.device_count()}
    try:
        torch.load(path)
        result["default"] = "loaded"
    except RuntimeError as e:
        result["default"] = str(e)
    for name, map_location in [("cpu", "cpu"), ("remap", {"openreg:1": "openreg:0"})]:
        state = torch.load(path, map_location=map_location)
        result[name] = {k: [str(v.device), v.cpu().tolist()] for k, v in state.items()}
    print("RESULT " + json.dumps(result))
    """
)


def test_checkpoint_from_a_device_the_loader_lacks_needs_map_location(tmp_path):
    path = tmp_path / "on_openreg1.pt"
    torch.save(nn.Linear(2, 1).to("openreg:1").state_dict(), path)
    saved = {k: v.cpu().tolist() for k, v in torch.load(path).items()}
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_WITH_ONE_DEVICE, str(path)],
        cwd=REPO,
        env={**os.environ, "OPENREG_DEVICE_COUNT": "1"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["device_count"] == 1
    assert result["default"] == (
        "Attempting to deserialize object on OPENREG device 1 but torch.openreg.device_count() is 1. "
        "Please use torch.load with map_location to map your storages to an existing device."
    )
    assert result["cpu"] == {k: ["cpu", v] for k, v in saved.items()}
    assert result["remap"] == {k: ["openreg:0", v] for k, v in saved.items()}


# --- weights_only ----------------------------------------------------------------------


def test_default_weights_only_load_accepts_openreg_tensors_and_state_dicts(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to("openreg:1")
    checkpoint = {"model": model.state_dict(), "step": 3, "tensors": [torch.ones(2, device="openreg")]}
    loaded = round_trip(checkpoint, tmp_path)  # weights_only=True by default since torch 2.6
    assert loaded["step"] == 3 and loaded["tensors"][0].device == torch.device("openreg:0")
    for name, value in model.state_dict().items():
        assert_same(loaded["model"][name], value.cpu(), "openreg:1")
    # The default really is weights_only: a whole module is refused.
    with pytest.raises(Exception, match="Weights only load failed"):
        round_trip(model, tmp_path)


# --- modules and optimizers ------------------------------------------------------------


def small_model(device, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)).to(device)


def test_state_dict_round_trip_loads_into_a_fresh_module(tmp_path):
    model = small_model("openreg:1")
    model(torch.randn(5, 3, device="openreg:1"))  # moves BatchNorm running stats
    fresh = small_model("openreg:1", seed=1)
    fresh.load_state_dict(round_trip(model.state_dict(), tmp_path))
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert b.device == torch.device("openreg:1"), name
        assert torch.equal(a.cpu(), b.cpu()), name
    model.eval(), fresh.eval()
    x = torch.randn(5, 3, device="openreg:1")
    assert torch.equal(model(x).cpu(), fresh(x).cpu())


def test_state_dict_loads_into_a_module_on_another_device(tmp_path):
    model = small_model("openreg:1")
    on_cpu = small_model("cpu", seed=1)
    on_cpu.load_state_dict(round_trip(model.state_dict(), tmp_path))  # copies into CPU parameters
    assert all(p.device.type == "cpu" for p in on_cpu.parameters())
    assert all(torch.equal(a.cpu(), b) for a, b in zip(model.state_dict().values(), on_cpu.state_dict().values()))


def test_whole_module_round_trip_with_weights_only_false(tmp_path):
    model = small_model("openreg:1").eval()
    loaded = round_trip(model, tmp_path, weights_only=False)
    assert type(loaded) is nn.Sequential
    assert all(p.device == torch.device("openreg:1") for p in loaded.parameters())
    x = torch.randn(5, 3, device="openreg:1")
    assert torch.equal(loaded(x).cpu(), model(x).cpu())
    on_cpu = round_trip(model, tmp_path, weights_only=False, map_location="cpu")
    assert all(p.device.type == "cpu" for p in on_cpu.parameters())


OPTIMIZERS = {
    "SGD-momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "Adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "AdamW-amsgrad": lambda params: torch.optim.AdamW(params, lr=0.01, amsgrad=True),
}


def train_step(model, optimizer, seed):
    torch.manual_seed(seed)
    x = torch.randn(8, 3, device="openreg:1")
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_resumed_training_equals_uninterrupted_training(tmp_path, name):
    model = small_model("openreg:1")
    optimizer = OPTIMIZERS[name](model.parameters())
    train_step(model, optimizer, seed=1)
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    checkpoint = torch.load(path)
    for state in checkpoint["optimizer"]["state"].values():
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":  # "step" stays a CPU scalar, as on CUDA
                assert value.device == torch.device("openreg:1"), key
    resumed = small_model("openreg:1", seed=1)
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizer = OPTIMIZERS[name](resumed.parameters())
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])

    train_step(model, optimizer, seed=2)
    train_step(resumed, resumed_optimizer, seed=2)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a.cpu(), b.cpu())


def test_optimizer_state_loads_onto_cpu_with_map_location(tmp_path):
    model = small_model("openreg:1")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_step(model, optimizer, seed=1)
    loaded = round_trip(optimizer.state_dict(), tmp_path, map_location="cpu")
    buffers = [state["momentum_buffer"] for state in loaded["state"].values()]
    assert buffers and all(b.device.type == "cpu" for b in buffers)
    expected = [optimizer.state[p]["momentum_buffer"].cpu() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(buffers, expected))


def test_storage_type_is_the_devices_legacy_storage_class_as_on_cuda():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "TypedStorage is deprecated"
        for dtype, name in [(torch.float32, "FloatStorage"), (torch.int64, "LongStorage"), (torch.bool, "BoolStorage")]:
            storage_type = torch.zeros(2, dtype=dtype, device="openreg").storage_type()
            assert storage_type is getattr(torch.openreg, name)
            assert storage_type.dtype == dtype
            assert isinstance(torch.zeros(2, dtype=dtype, device="openreg").storage(), storage_type)
            assert not isinstance(torch.zeros(2, dtype=dtype).storage(), storage_type)
            # as torch.cuda.FloatStorage is named: TypedStorage.type()
            assert torch.zeros(2, dtype=dtype, device="openreg").storage().type() == f"torch.openreg.{name}"
        made = torch.openreg.FloatStorage(3)
        assert made.device.type == "openreg" and made.dtype == torch.float32 and made.size() == 3
