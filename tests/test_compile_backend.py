"""torch.compile(..., backend="openreg"): openreg's dynamo backend (Inductor plus a
report of what each compiled graph leaves to eager kernels), found through the
torch_dynamo_backends entry point as torch finds out-of-tree backends."""

import importlib.metadata
import warnings

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._inductor.utils import fresh_cache, run_and_get_code

from torch_openreg.openreg import compile_backend

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)


@pytest.fixture(autouse=True)
def fresh_compilation():
    torch._dynamo.reset()
    compile_backend.reset_graph_reports()
    with inductor_config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


def mlp_step(x, w1, w2):
    return (torch.relu(x @ w1) @ w2).sum()


def with_a_fallback_operator(a, b):
    return torch.cdist(a, b).relu() * 2


def inputs(device, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(8, 16, generator=g), torch.randn(16, 32, generator=g), torch.randn(32, 4, generator=g)]
    return [t.to(device).requires_grad_(requires_grad) for t in tensors]


def test_backend_is_declared_as_an_entry_point_and_listed_by_dynamo():
    points = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert points["openreg"].value == "torch_openreg.openreg.compile_backend:openreg"
    assert "openreg" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("openreg") is compile_backend.openreg


def test_compiled_forward_and_backward_equal_inductors_and_are_reported():
    results = {}
    for backend in ("inductor", "openreg"):
        torch._dynamo.reset()
        args = inputs("openreg", requires_grad=True)
        loss, (code, *_) = run_and_get_code(torch.compile(mlp_step, backend=backend), *args)
        loss.backward()
        results[backend] = (loss, [a.grad for a in args], code)
    (loss, grads, code), (ref_loss, ref_grads, ref_code) = results["openreg"], results["inductor"]
    # The same generated wrapper (but for the AOT graph id): the backend is Inductor.
    assert code.split("\n", 1)[1] == ref_code.split("\n", 1)[1]
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref, rtol=0, atol=0)
    eager = inputs("cpu", requires_grad=True)
    torch.testing.assert_close(loss.cpu(), mlp_step(*eager))

    reports = compile_backend.graph_reports()
    assert [r.graph for r in reports] == ["forward 0", "backward 0"]
    forward, backward = reports
    assert forward.kernels and all(name.startswith("cpp_fused") for name in forward.kernels)
    assert forward.operators == {"aten::mm": "native"}
    assert backward.operators.get("aten::mm") == "native"
    assert not forward.cpu_fallback and not backward.cpu_fallback
    assert "forward 0: " in str(forward) and "aten::mm" in str(forward)


def test_operator_on_the_cpu_fallback_is_reported_and_warned_about():
    a, b = torch.randn(5, 3, device="openreg"), torch.randn(4, 3, device="openreg")
    with pytest.warns(UserWarning, match=r"inference 0 calls aten::_cdist_forward on openreg's CPU fallback"):
        out = torch.compile(with_a_fallback_operator, backend="openreg", options={"fallback": "warn"})(a, b)
    torch.testing.assert_close(out.cpu(), with_a_fallback_operator(a.cpu(), b.cpu()))
    (report,) = compile_backend.graph_reports()
    assert report.cpu_fallback == ("aten::_cdist_forward",)
    assert report.operators["aten::_cdist_forward"] == "fallback"


def test_fallback_error_refuses_the_graph_before_it_runs():
    a, b = torch.randn(5, 3, device="openreg"), torch.randn(4, 3, device="openreg")
    torch.openreg.reset_fallback_stats()
    compiled = torch.compile(with_a_fallback_operator, backend="openreg", options={"fallback": "error"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=r"aten::_cdist_forward on openreg's CPU fallback"):
        compiled(a, b)
    assert torch.openreg.fallback_stats() == {}  # nothing ran


def test_fallback_option_defaults_to_the_devices_fallback_mode():
    a, b = torch.randn(5, 3, device="openreg"), torch.randn(4, 3, device="openreg")
    assert torch.openreg.get_fallback_mode() == "silent"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "silent": no warning
        torch.compile(with_a_fallback_operator, backend="openreg")(a, b)
    torch._dynamo.reset()
    torch.openreg.set_fallback_mode("warn")
    try:
        with pytest.warns(UserWarning, match="aten::_cdist_forward"):
            torch.compile(with_a_fallback_operator, backend="openreg")(a, b)
    finally:
        torch.openreg.set_fallback_mode("silent")


def test_malformed_fallback_option_names_the_accepted_values():
    compiled = torch.compile(mlp_step, backend="openreg", options={"fallback": "loud"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=r"options\[\"fallback\"\] must be one of 'silent', 'warn', 'error', got 'loud'"):
        compiled(*inputs("openreg"))


def test_other_options_are_inductors():
    args = inputs("openreg")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="no_such_inductor_option"):
        torch.compile(mlp_step, backend="openreg", options={"no_such_inductor_option": 1})(*args)
    torch._dynamo.reset()
    _, (checked,) = run_and_get_code(torch.compile(mlp_step, backend="openreg"), *args)
    torch._dynamo.reset()
    _, (unchecked,) = run_and_get_code(torch.compile(mlp_step, backend="openreg", options={"size_asserts": False}), *args)
    assert "assert_size_stride(arg" in checked and "assert_size_stride(arg" not in unchecked


def test_report_is_read_from_the_wrapper_on_an_fx_graph_cache_hit():
    args = inputs("openreg")
    with fresh_cache(), inductor_config.patch(fx_graph_cache=True):
        torch.compile(mlp_step, backend="openreg")(*args)
        torch._dynamo.reset()
        torch.compile(mlp_step, backend="openreg")(*args)
    first, second = compile_backend.graph_reports()
    assert first.kernels == second.kernels and first.operators == second.operators
