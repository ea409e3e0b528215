"""Bad input: a clear Python exception that names the device or operator and
says what to do, and the device keeps working afterwards."""

import os
import subprocess
import sys

import pytest
import torch

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"


def test_openreg_tensors_on_two_devices_are_rejected():
    a = torch.ones(3, device="openreg:0")
    b = torch.ones(3, device="openreg:1")
    with pytest.raises(RuntimeError, match=r"same device.*openreg:0 and openreg:1"):
        a + b
    with pytest.raises(RuntimeError, match=r"same device.*openreg:0 and openreg:1"):
        torch.cat([a, b])  # through the fallback
    assert (a + a).sum().item() == 6


def test_openreg_with_cpu_tensor_is_rejected_where_cuda_rejects_it():
    a = torch.ones(3, device=DEV)
    with pytest.raises(RuntimeError, match=r"same device.*openreg:0 and cpu"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match=r"openreg:0 and cpu.*torch.cat|openreg:0 and cpu"):
        torch.cat([a, torch.ones(3)])
    with pytest.raises(RuntimeError, match=r"same device.*openreg:0 and cpu"):
        torch.where(a > 0, a, torch.zeros(3))


@pytest.mark.parametrize("cpu_operand", ["A", "B"])
@pytest.mark.parametrize(
    "solve",
    [torch.linalg.solve, lambda a, b: torch.linalg.solve_ex(a, b)[0],
     lambda a, b: torch.linalg.tensorsolve(a.reshape(3, 1, 3), b)],
    ids=["solve", "solve_ex", "tensorsolve"],
)
def test_a_linear_solve_with_a_cpu_operand_is_rejected(solve, cpu_operand):
    # Not torch's composite, whose meta() puts the result on B's device and LU on A's.
    a, b = torch.eye(3, device=DEV), torch.ones(3, device=DEV)
    a, b = (a.cpu(), b) if cpu_operand == "A" else (a, b.cpu())
    with pytest.raises(RuntimeError, match=r"same device.*(openreg:0|cpu)"):
        solve(a, b)


def test_an_out_tensor_on_the_cpu_is_rejected_and_left_alone():
    m, a, b = torch.randn(2, 3, device=DEV), torch.randn(2, device=DEV), torch.randn(3, device=DEV)
    out = torch.zeros(2, 3)
    for call in (lambda: torch.add(m, m, out=out), lambda: torch.addr(m, a, b, out=out)):
        with pytest.raises(RuntimeError, match=r"same device.*openreg:0 and cpu"):
            call()
    assert torch.equal(out, torch.zeros(2, 3))


def test_a_boolean_beta_or_alpha_is_refused_for_non_boolean_tensors_as_on_cpu():
    m, a, b = torch.randn(2, 3, device=DEV), torch.randn(2, device=DEV), torch.randn(3, device=DEV)
    for kwargs in ({"beta": True}, {"alpha": False}):
        with pytest.raises(RuntimeError, match="Boolean (beta|alpha) only supported for Boolean results"):
            torch.addr(m, a, b, **kwargs)
    flags = torch.zeros(2, 3, dtype=torch.bool, device=DEV)
    x, y = torch.tensor([True, False], device=DEV), torch.tensor([True, True, False], device=DEV)
    assert torch.equal(torch.addr(flags, x, y, beta=True).cpu(), torch.addr(flags.cpu(), x.cpu(), y.cpu(), beta=True))


def test_zero_dim_cpu_tensor_is_accepted_like_a_scalar():
    a = torch.ones(3, device=DEV)
    assert (a * torch.tensor(2.0)).cpu().tolist() == [2.0, 2.0, 2.0]


def test_fallback_error_names_the_operator_and_argument():
    a = torch.ones(3, device=DEV)
    with pytest.raises(RuntimeError, match=r"aten::cat.*argument 'tensors'.*\.to\(\"openreg:0\"\)"):
        torch.cat([a, torch.ones(3)])


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(2, device="openreg:5"),
        lambda: torch.ones(2).to("openreg:2"),
        lambda: torch.openreg.set_device(9),
        lambda: torch.openreg.synchronize(3),
    ],
)
def test_device_index_out_of_range(make):
    with pytest.raises(RuntimeError, match=r"device index is out of range: openreg:\d.*2 openreg devices.*OPENREG_DEVICE_COUNT"):
        make()
    assert torch.ones(1, device=DEV).item() == 1


def test_negative_device_index_rejected_by_torch():
    with pytest.raises(RuntimeError, match="Device index must not be negative"):
        torch.device("openreg", -2)


def test_openreg_generator_with_cpu_tensors():
    g = torch.Generator(device=DEV)
    with pytest.raises(RuntimeError, match="openreg generator but runs on the CPU"):
        torch.randn(3, generator=g)


def test_pin_memory_is_refused_clearly():
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.empty(2, device=DEV, pin_memory=True)


def test_sparse_operator_cpu_lacks_is_refused_clearly():
    # The dispatcher routes sparse layouts to the SparsePrivateUse1 key, whose
    # fallback runs SparseCPU kernels (docs/integration/operators.md); an operator without one
    # raises naming the operator, the layout and the way out, not torch's
    # "Could not run ... 'Sparseopenreg' backend".
    s = torch.empty(2, device=DEV, layout=torch.sparse_coo)
    with pytest.raises(NotImplementedError, match=r"aten::cumsum got a torch\.sparse_coo tensor on openreg.*to_dense"):
        torch.cumsum(s, 0)
    assert torch.ones(1, device=DEV).item() == 1


def _import_with(count: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPENREG_DEVICE_COUNT=count)
    return subprocess.run(
        [sys.executable, "-c", "import torch; import torch_openreg"],
        env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.modes()  # a child process's start-up, the same under every launch switch
@pytest.mark.parametrize("count", ["abc", "0", "-1", "17", "2x"])
def test_bad_device_count_is_an_error_at_import(count):
    result = _import_with(count)
    assert result.returncode == 1, result.stderr  # a Python exception, not a crash
    assert f"OPENREG_DEVICE_COUNT='{count}' is not a whole number from 1 to 16" in result.stderr
    assert "Traceback" in result.stderr


@pytest.mark.modes()  # a child process's start-up, the same under every launch switch
def test_device_count_from_environment():
    env = dict(os.environ, OPENREG_DEVICE_COUNT="4")
    out = subprocess.run(
        [sys.executable, "-c", "import torch, torch_openreg; print(torch.openreg.device_count()); "
         "print(torch.ones(1, device='openreg:3').device)"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()
    assert out == ["4", "openreg:3"]


def test_nested_operators_without_a_nested_kernel_raise_a_clear_error_and_jagged_tensors_work():
    # (tests/test_nested.py covers what runs on nested tensors of the strided layout.)
    strided = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], device=DEV)
    with pytest.raises(NotImplementedError, match="aten::cumsum got a nested tensor of the strided layout on openreg.*jagged"):
        torch.cumsum(strided, 1)
    jagged = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged, device=DEV)
    assert (jagged + 1).is_nested
    # The device keeps working.
    assert torch.ones(2, device=DEV).sum().item() == 2
