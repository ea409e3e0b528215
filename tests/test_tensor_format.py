"""Backend metadata on tensors: openreg's format tag (c10::BackendMeta) and every
place PyTorch is told to carry it (docs/integration/device.md)."""

import copy
import io

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torch.openreg import set_tensor_format, tensor_format

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)


def tagged(*size, format="blocked", device="openreg"):
    t = torch.arange(float(torch.Size(size).numel()), device=device).reshape(size)
    set_tensor_format(t, format)
    return t


def test_a_new_tensor_has_no_format_and_a_tag_can_be_set_and_removed():
    t = torch.ones(3, device="openreg")
    assert tensor_format(t) is None
    set_tensor_format(t, "blocked_16")
    assert tensor_format(t) == "blocked_16"
    set_tensor_format(t, None)
    assert tensor_format(t) is None
    assert torch._utils.get_tensor_metadata(t) == {}


def test_torch_metadata_api_reads_and_writes_the_tag():
    t = tagged(2, 3)
    assert torch._utils.get_tensor_metadata(t) == {"openreg.format.blocked": True}
    u = torch.zeros(2, device="openreg")
    torch._utils.set_tensor_metadata(u, {"openreg.format.nc4": True})
    assert tensor_format(u) == "nc4"


@pytest.mark.parametrize("weights_only", [True, False])
def test_save_and_load_keep_the_tag(weights_only):
    state = {"w": tagged(2, 3), "plain": torch.ones(2, device="openreg")}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=weights_only)
    assert tensor_format(loaded["w"]) == "blocked" and tensor_format(loaded["plain"]) is None
    assert torch.equal(loaded["w"].cpu(), state["w"].cpu())


def test_loading_onto_the_cpu_drops_the_tag():
    buffer = io.BytesIO()
    torch.save(tagged(4), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cpu")
    assert loaded.device.type == "cpu" and torch._utils.get_tensor_metadata(loaded) == {}


def test_deepcopy_keeps_the_tag_and_copies_the_data():
    model = torch.nn.Linear(3, 2).to("openreg")
    set_tensor_format(model.weight, "blocked")
    clone = copy.deepcopy(model)
    assert tensor_format(clone.weight) == "blocked" and tensor_format(clone.bias) is None
    assert clone.weight.data_ptr() != model.weight.data_ptr()
    assert torch.equal(clone.weight.cpu(), model.weight.cpu())


def test_copies_of_the_data_keep_the_tag():
    t = tagged(2, 3)
    assert tensor_format(t.to("openreg:1")) == "blocked"
    assert tensor_format(t.clone()) == "blocked"
    assert tensor_format(t.to(torch.float64)) == "blocked"
    assert tensor_format(torch.empty(2, 3, device="openreg").copy_(t)) == "blocked"
    own = torch.empty(2, 3, device="openreg")
    set_tensor_format(own, "plain_rows")
    own.copy_(t)  # a destination keeps its own format
    assert tensor_format(own) == "plain_rows"


def test_shallow_copies_keep_the_tag():
    t = tagged(4)
    assert tensor_format(t.detach()) == "blocked"
    assert tensor_format(torch.nn.Parameter(t)) == "blocked"
    p = torch.nn.Parameter(torch.zeros(4, device="openreg"))
    p.data = t
    assert tensor_format(p) == "blocked"


def test_module_to_another_openreg_device_keeps_the_tag():
    model = torch.nn.Linear(3, 2).to("openreg")
    set_tensor_format(model.weight, "blocked")
    model.to("openreg:1")
    assert model.weight.device == torch.device("openreg:1") and tensor_format(model.weight) == "blocked"


def test_results_of_other_operators_carry_no_tag():
    t = tagged(4)
    assert tensor_format(t + 1) is None and tensor_format(t.cpu()) is None and tensor_format(t[1:]) is None


def test_fake_tensors_carry_the_tag():
    t = tagged(2, 3)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(t)
        assert fake.device == t.device
        assert tensor_format(fake) == "blocked"
        assert tensor_format(mode.from_tensor(torch.ones(2, device="openreg"))) is None


def test_compiled_graph_sees_the_tag_at_trace_time():
    seen = []

    @torch.library.custom_op("openreg_test::format_probe", mutates_args=())
    def format_probe(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @format_probe.register_fake
    def _(x):
        seen.append(tensor_format(x))
        return torch.empty_like(x)

    torch._dynamo.reset()
    out = torch.compile(lambda x: format_probe(x) * 2, backend="aot_eager", fullgraph=True)(tagged(3))
    assert "blocked" in seen
    assert torch.equal(out.cpu(), torch.arange(3.0) * 2)


@pytest.mark.parametrize("bad", ["", "has space", "dash-ed", "x" * 65])
def test_malformed_format_name_is_refused_and_changes_nothing(bad):
    t = tagged(2)
    with pytest.raises(ValueError, match="a format is a name of 1 to 64 letters, digits and underscores"):
        set_tensor_format(t, bad)
    assert tensor_format(t) == "blocked"


def test_tagging_a_cpu_tensor_is_refused():
    with pytest.raises(RuntimeError, match="only openreg tensors carry a format, got a cpu tensor"):
        set_tensor_format(torch.ones(2), "blocked")
    with pytest.raises(TypeError, match="expects a str or None"):
        set_tensor_format(torch.ones(2, device="openreg"), 3)
