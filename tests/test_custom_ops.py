"""openreg::add_relu, the custom operator declared in backend_functions.yaml:
forward against the CPU composite, its generated autograd, its Meta kernel
under FakeTensor and torch.compile, and its errors."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing import assert_close

MODES = ("trace",)  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"
add_relu = torch.ops.openreg.add_relu


def reference(a, b, alpha=1):
    return torch.relu(a + alpha * b)


def test_schema_is_registered_in_the_openreg_namespace():
    schema = str(add_relu.default._schema)
    assert schema == "openreg::add_relu(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
    assert torch.Tag.pt2_compliant_tag in add_relu.default.tags


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_forward_matches_cpu_with_broadcasting(dtype):
    a = (torch.randn(5, 6) * 10).to(dtype)
    b = (torch.randn(6) * 10).to(dtype)
    out = add_relu(a.to(DEV), b.to(DEV), alpha=2)
    assert out.device.type == DEV and out.dtype == dtype
    assert_close(out.cpu(), reference(a, b, 2))


def test_forward_promotes_types_and_takes_non_contiguous_inputs():
    a = torch.randn(6, 5).t()
    i = torch.arange(-10, 20, dtype=torch.int32).reshape(5, 6)
    out = add_relu(a.to(DEV), i.to(DEV))
    assert out.dtype == torch.float32
    assert_close(out.cpu(), reference(a, i))


def test_backward_matches_cpu_autograd():
    a = torch.randn(4, 5, dtype=torch.float64)
    b = torch.randn(5, dtype=torch.float64)
    da, db = a.to(DEV).requires_grad_(), b.to(DEV).requires_grad_()
    add_relu(da, db, alpha=0.5).pow(2).sum().backward()
    ca, cb = a.clone().requires_grad_(), b.clone().requires_grad_()
    reference(ca, cb, 0.5).pow(2).sum().backward()
    assert_close(da.grad.cpu(), ca.grad)
    assert_close(db.grad.cpu(), cb.grad)  # summed over the broadcast dimension
    assert "AddReluFunction" in add_relu(da, db).grad_fn.name()


def test_gradcheck():
    a = torch.randn(3, 4, dtype=torch.float64, device=DEV, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, device=DEV, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: add_relu(x, y, alpha=1.5), (a, b))


def test_double_backward_raises_clearly():
    a = torch.randn(3, dtype=torch.float64, device=DEV, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, device=DEV, requires_grad=True)
    (ga,) = torch.autograd.grad(add_relu(a, b).sum(), a, create_graph=True)
    with pytest.raises(RuntimeError, match="derivative for openreg::add_relu_backward is not implemented"):
        ga.sum().backward()


def test_meta_kernel_under_fake_tensor_mode():
    with FakeTensorMode() as mode:
        a = mode.from_tensor(torch.empty(7, 1, device=DEV))
        b = mode.from_tensor(torch.empty(3, dtype=torch.float64, device=DEV))
        out = add_relu(a, b)
    assert out.shape == (7, 3) and out.dtype == torch.float64 and out.device.type == DEV


def test_meta_tensors():
    out = add_relu(torch.empty(2, 3, device="meta"), torch.empty(3, device="meta"))
    assert out.shape == (2, 3) and out.device.type == "meta"


def test_torch_compile_traces_forward_and_backward():
    # aot_eager traces the joint forward/backward graph with FakeTensors,
    # through the Meta kernels. (Inductor code generation for openreg is the
    # training issue's work.)
    torch._dynamo.reset()

    def f(x, y):
        return add_relu(x * 2, y).sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    a = torch.randn(4, 5, device=DEV, requires_grad=True)
    b = torch.randn(5, device=DEV, requires_grad=True)
    out = compiled(a, b)
    out.backward()
    ca, cb = a.detach().cpu().requires_grad_(), b.detach().cpu().requires_grad_()
    expected = reference(ca * 2, cb).sum()
    expected.backward()
    assert_close(out.detach().cpu(), expected.detach())
    assert_close(a.grad.cpu(), ca.grad)
    assert_close(b.grad.cpu(), cb.grad)


def test_cpu_tensors_are_rejected_with_the_backend_named():
    with pytest.raises(NotImplementedError, match="openreg::add_relu.*'CPU' backend"):
        add_relu(torch.ones(2), torch.ones(2))


def test_mixed_devices_are_rejected():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        add_relu(torch.ones(2, device=DEV), torch.ones(2))


def test_bool_inputs_are_rejected_with_the_reason():
    with pytest.raises(RuntimeError, match="expected real, non-bool inputs"):
        add_relu(torch.ones(2, dtype=torch.bool, device=DEV), torch.ones(2, dtype=torch.bool, device=DEV))


def test_backward_op_runs_on_its_own():
    grad = torch.ones(2, 3, device=DEV)
    result = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], device=DEV)
    gs, go = torch.ops.openreg.add_relu_backward(grad, result, result, torch.ones(3, device=DEV), 2)
    assert gs.cpu().tolist() == [[1, 0, 1], [0, 1, 0]]
    assert go.cpu().tolist() == [2, 2, 2]
