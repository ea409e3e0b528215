"""Operators without an openreg kernel run through the CPU fallback: results
equal CPU's, in-place and out= write device memory, views stay views."""

import os
import pytest
import torch
from torch.testing import assert_close

MODES = ("trace", "queue_all", "blocking", "discrete")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"
DISCRETE = os.environ.get("OPENREG_DISCRETE_MEMORY") == "1"


def both(fn, *tensors):
    """fn on CPU tensors and on openreg copies of them."""
    return fn(*tensors), fn(*(t.to(DEV) for t in tensors))


def check(fn, *tensors, **tol):
    cpu, dev = both(fn, *tensors)
    if isinstance(cpu, torch.Tensor):
        cpu, dev = (cpu,), (dev,)
    for c, d in zip(cpu, dev):
        assert d.device.type == "openreg", f"result on {d.device}"
        assert d.shape == c.shape and d.dtype == c.dtype
        assert_close(d.cpu(), c, **tol)


def test_matmul_family():
    a, b = torch.randn(5, 4), torch.randn(4, 3)
    check(torch.mm, a, b)
    check(torch.matmul, torch.randn(2, 5, 4), torch.randn(4, 3))
    check(lambda x, w, bias: torch.nn.functional.linear(x, w, bias), a, torch.randn(6, 4), torch.randn(6))
    check(torch.bmm, torch.randn(2, 3, 4), torch.randn(2, 4, 5))


def test_elementwise_with_broadcast_and_promotion():
    check(torch.add, torch.randn(3, 1), torch.randn(1, 4))
    check(torch.mul, torch.arange(6).reshape(2, 3), torch.randn(3))
    check(lambda x: x + 2.5, torch.arange(4))
    check(lambda x: x * torch.tensor(3), torch.randn(4))  # 0-dim CPU operand


def test_reductions():
    x = torch.randn(4, 5)
    check(torch.sum, x)
    check(lambda t: t.mean(dim=1, keepdim=True), x)
    check(lambda t: t.max(dim=0), x)
    check(lambda t: t.std(dim=1), x)
    check(torch.argmax, x)
    check(lambda t: t.norm(), x)
    check(lambda t: (t > 0).any(), x)


@pytest.mark.parametrize("name", ["abs", "isnan", "isinf", "isfinite", "neg", "exp", "sign"])
def test_out_of_place_unary_keeps_shape(name):
    # at::native::cpu_fallback returns shape [0] for some of these (pytorch#165549).
    x = torch.tensor([[-1.0, float("nan")], [float("inf"), 2.0]])
    check(getattr(torch, name), x, equal_nan=True)


def test_in_place_writes_device_memory():
    cpu = torch.randn(3, 4)
    dev = cpu.to(DEV)
    ptr = dev.data_ptr()
    cpu.mul_(2).add_(1).clamp_(min=0)
    dev.mul_(2).add_(1).clamp_(min=0)
    assert dev.data_ptr() == ptr
    assert_close(dev.cpu(), cpu)


def test_in_place_on_noncontiguous_view_updates_base():
    cpu = torch.zeros(4, 6)
    dev = cpu.to(DEV)
    cpu[:, ::2].add_(torch.arange(3.0))
    dev[:, ::2].add_(torch.arange(3.0, device=DEV))
    assert_close(dev.cpu(), cpu)


def test_out_argument_of_right_shape_is_written_in_place():
    a, b = torch.randn(3), torch.randn(3)
    out = torch.empty(3, device=DEV)
    ptr = out.data_ptr()
    result = torch.add(a.to(DEV), b.to(DEV), out=out)
    assert result is out and out.data_ptr() == ptr
    assert_close(out.cpu(), a + b)


def test_out_argument_is_resized_like_cpu():
    a = torch.randn(2, 3)
    out = torch.empty(0, device=DEV)
    torch.abs(a.to(DEV), out=out)
    assert out.shape == (2, 3)
    assert_close(out.cpu(), a.abs())


def test_out_resized_by_the_cpu_kernel_adopts_device_memory_and_frees_it():
    # abs.out resizes an empty out: the CPU kernel grows the CPU alias into
    # device memory, which the out tensor then owns (no copy back).
    x = torch.randn(64, 33)
    baseline = torch.accelerator.memory_allocated(0)
    dx = x.to(DEV)
    out = torch.empty(0, device=DEV)
    torch.abs(dx, out=out)
    assert out.shape == x.shape and out.device == dx.device
    assert_close(out.cpu(), x.abs())
    grown = torch.accelerator.memory_allocated(0) - baseline
    block = -(-64 * 33 * 4 // 512) * 512  # the allocator rounds to 512 bytes
    assert grown == 2 * block  # dx and out, nothing left over
    out.add_(1)  # the adopted memory is an ordinary device storage
    assert_close(out.cpu(), x.abs() + 1)
    del dx, out
    assert torch.accelerator.memory_allocated(0) == baseline


def test_out_on_another_device_is_resized_on_that_device():
    x = torch.randn(10)
    out = torch.empty(0, device="openreg:1")
    torch.abs(x.to("openreg:1"), out=out)
    assert out.device == torch.device("openreg:1")
    assert_close(out.cpu(), x.abs())
    assert out.untyped_storage().device == torch.device("openreg:1")


def test_out_argument_with_wrong_dtype_errors_like_cpu():
    a = torch.randn(3)
    cpu_out = torch.empty(3, dtype=torch.int64)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.add(a, a, out=cpu_out)
    with pytest.raises(RuntimeError) as dev_error:
        torch.add(a.to(DEV), a.to(DEV), out=torch.empty(3, dtype=torch.int64, device=DEV))
    assert str(dev_error.value).splitlines()[0] == str(cpu_error.value).splitlines()[0]


def test_indexing():
    x = torch.randn(5, 4)
    idx = torch.tensor([3, 0, 3])
    check(lambda t: t[idx.to(t.device)], x)
    check(lambda t: t[t > 0], x)
    check(lambda t: t.index_select(0, idx.to(t.device)), x)
    check(lambda t: t.gather(1, torch.zeros(5, 2, dtype=torch.long, device=t.device)), x)
    check(lambda t: t[1:4, ::2], x)


def test_indexing_with_cpu_indices_like_cuda():
    x = torch.randn(5, 4)
    idx = torch.tensor([4, 1])
    dev = x.to(DEV)
    assert_close(dev[idx].cpu(), x[idx])
    dev[idx] = torch.tensor(0.0)
    x[idx] = 0.0
    assert_close(dev.cpu(), x)


def test_index_put_and_masked_fill():
    cpu = torch.zeros(4, 3)
    dev = cpu.to(DEV)
    cpu.index_put_((torch.tensor([0, 2]),), torch.tensor(7.0))
    dev.index_put_((torch.tensor([0, 2], device=DEV),), torch.tensor(7.0, device=DEV))
    assert_close(dev.cpu(), cpu)
    check(lambda t: t.masked_fill(t > 0, -1.0), torch.randn(3, 3))


def test_view_ops_through_fallback_alias_their_base():
    dev = torch.zeros(6, device=DEV)
    windows = dev.unfold(0, 2, 2)  # aten::unfold has no openreg kernel
    assert windows._base is dev
    windows.fill_(3)
    assert dev.cpu().tolist() == [3.0] * 6
    c = torch.zeros(3, dtype=torch.complex64, device=DEV)
    real = torch.view_as_real(c)
    real[:, 0] = 1
    assert c.cpu().tolist() == [1 + 0j] * 3


def test_tensor_list_ops():
    xs = [torch.randn(2, 3) for _ in range(3)]
    check(lambda *t: torch.cat(t, dim=1), *xs)
    check(lambda *t: torch.stack(t), *xs)
    cpu_parts, dev_parts = both(lambda t: t.split(2), torch.randn(5, 2))
    assert len(dev_parts) == len(cpu_parts)
    for c, d in zip(cpu_parts, dev_parts):
        assert_close(d.cpu(), c)


def test_foreach_in_place_updates_every_tensor():
    cpu = [torch.randn(3), torch.randn(2, 2)]
    dev = [t.to(DEV) for t in cpu]
    torch._foreach_add_(cpu, 1.5)
    torch._foreach_add_(dev, 1.5)
    for c, d in zip(cpu, dev):
        assert_close(d.cpu(), c)


def test_multi_output_ops():
    check(lambda t: torch.sort(t, dim=1), torch.randn(3, 5))
    check(lambda t: torch.topk(t, 2), torch.randn(6))
    check(lambda t: torch.aminmax(t), torch.randn(6))


def test_factories_land_on_the_device():
    for make in (
        lambda d: torch.arange(5, device=d),
        lambda d: torch.full((2, 2), 3.0, device=d),
        lambda d: torch.zeros(3, device=d),
        lambda d: torch.ones(2, dtype=torch.int32, device=d),
        lambda d: torch.linspace(0, 1, 5, device=d),
        lambda d: torch.eye(3, device=d),
    ):
        cpu, dev = make("cpu"), make(DEV)
        assert dev.device.type == "openreg"
        assert_close(dev.cpu(), cpu)
    assert torch.zeros(2, device="openreg:1").device == torch.device("openreg:1")


def test_random_ops_draw_from_the_device_generator():
    torch.manual_seed(123)
    a = torch.randn(8, device=DEV)
    b = torch.rand(8, device=DEV)
    p = torch.randperm(10, device=DEV)
    torch.manual_seed(123)
    assert_close(torch.randn(8, device=DEV).cpu(), a.cpu())
    assert_close(torch.rand(8, device=DEV).cpu(), b.cpu())
    assert_close(torch.randperm(10, device=DEV).cpu(), p.cpu())
    # The device generator is separate from the CPU one.
    torch.openreg.manual_seed(5)
    torch.randn(4)
    x = torch.randn(4, device=DEV)
    torch.openreg.manual_seed(5)
    assert_close(torch.randn(4, device=DEV).cpu(), x.cpu())


def test_explicit_device_generator():
    g = torch.Generator(device="openreg:1").manual_seed(7)
    a = torch.randn(5, device="openreg:1", generator=g)
    g.manual_seed(7)
    b = torch.empty(5, device="openreg:1").normal_(generator=g)
    assert_close(a.cpu(), b.cpu())


def test_autograd_through_fallback_matches_cpu():
    w_cpu = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(5, 4)
    w_dev = w_cpu.detach().to(DEV).requires_grad_()
    loss_cpu = torch.tanh(x @ w_cpu).pow(2).sum()
    loss_dev = torch.tanh(x.to(DEV) @ w_dev).pow(2).sum()
    loss_cpu.backward()
    loss_dev.backward()
    assert w_dev.grad.device.type == "openreg"
    assert_close(w_dev.grad.cpu(), w_cpu.grad)


def test_small_module_forward_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(36, 2)
    )
    x = torch.randn(2, 3, 8, 8)
    expected = model(x)
    model.openreg()
    assert_close(model(x.openreg()).cpu(), expected, rtol=1e-4, atol=1e-5)


def test_blocklisted_operator_raises_with_reason():
    t = torch.ones(2, device=DEV)
    with pytest.raises(NotImplementedError, match=r"aten::_pin_memory is blocked on openreg: only CPU tensors can be pinned"):
        torch.ops.aten._pin_memory(t)
    assert t.sum().item() == 2  # the device keeps working


def test_fallback_leaks_no_device_memory():
    def work():
        a = torch.randn(64, 64, device=DEV)
        b = (a @ a).abs().sum(dim=0)  # fresh results
        a.add_(1)  # in place
        out = torch.empty(0, device=DEV)
        torch.abs(a, out=out)  # out= resized
        v = a.unfold(0, 8, 8)  # view through the fallback
        return b.sum().item() + v.sum().item() + out.sum().item()

    work()
    baseline = torch.accelerator.memory_allocated(0)
    for _ in range(50):
        work()
    assert torch.accelerator.memory_allocated(0) == baseline


def test_cpu_kernel_that_keeps_its_input_keeps_the_device_memory_alive():
    # A CPU kernel sees CPU aliases of the openreg operands (host copies with
    # OPENREG_DISCRETE_MEMORY=1). One that keeps its input after the call keeps
    # a valid tensor: the alias then holds the device memory, which is freed
    # once the alias goes.
    kept = []
    lib = torch.library.Library("openreg_test_keep", "DEF")
    try:
        lib.define("keep(Tensor x) -> Tensor")

        def keep(x):
            kept.append(x)
            return x + 1

        lib.impl("keep", keep, "CPU")
        torch.openreg.synchronize()
        baseline = torch.accelerator.memory_allocated(0)
        t = torch.arange(4.0, device=DEV)
        out = torch.ops.openreg_test_keep.keep(t)
        assert out.device.type == DEV and out.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
        del t, out
        if DISCRETE:
            # The kernel kept a host copy: the device memory is free.
            assert torch.accelerator.memory_allocated(0) == baseline
        else:
            assert torch.accelerator.memory_allocated(0) > baseline  # still held by the kept alias
        for _ in range(3):
            torch.full((4,), 7.0, device=DEV).add_(1)  # would reuse the memory if it had been freed
        assert kept[0].device.type == "cpu" and kept[0].tolist() == [0.0, 1.0, 2.0, 3.0]
        kept.clear()
        assert torch.accelerator.memory_allocated(0) == baseline
    finally:
        lib._destroy()


def test_cpu_kernel_written_in_python_runs_again_and_again():
    # CPU aliases are recycled between calls on a thread; a kernel written in
    # Python gets them as Python tensors, and the calls after it still work.
    lib = torch.library.Library("openreg_test_plus_one", "DEF")
    try:
        lib.define("plus_one(Tensor x) -> Tensor")
        lib.impl("plus_one", lambda x: x + 1, "CPU")
        a = torch.arange(4.0, device=DEV)
        expected = torch.arange(4.0).view(2, 2)
        for _ in range(20):
            assert torch.ops.openreg_test_plus_one.plus_one(a).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
            m = a.view(2, 2)
            assert_close(torch.mm(m, m).cpu(), expected @ expected)  # a cpu_kernels call reusing aliases
    finally:
        lib._destroy()


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64, torch.complex128])
def test_a_cpu_kernel_that_sets_its_outputs_conj_bit_gives_it_to_the_device_tensor(dtype):
    # linalg_lu_solve(left=False) solves the adjoint system and returns its
    # complex result as a conjugate view, by setting the out='s conj bit.
    A = torch.randn(3, 4, 4, dtype=dtype)
    B = torch.randn(3, 2, 4, dtype=dtype)
    expected = torch.linalg.lu_solve(*torch.linalg.lu_factor(A), B, left=False)
    LU, pivots = torch.linalg.lu_factor(A.to(DEV))
    for _ in range(3):  # the first call of a kind runs at once, later ones may be queued
        actual = torch.linalg.lu_solve(LU, pivots, B.to(DEV), left=False)
        assert actual.is_conj() == expected.is_conj()
        assert_close(actual.cpu(), expected)
