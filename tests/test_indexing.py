"""Indexing kernels (csrc/kernels/Index.cpp): x[indices] (torch's
structured index_out with openreg's index_stub kernel), x[indices] = v
(torch's _index_put_impl_, or CPU's kernel where it would sort), and
index_select (block copies, or CPU's kernel). Results must be CPU's."""

import pytest
import torch

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"


def same(actual, expected):
    assert actual.device.type == DEV
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual.cpu(), expected)


T = torch.arange(60.0).reshape(4, 5, 3)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize(
    "index",
    [torch.tensor([0, 2, 1, 2]), torch.tensor([1], dtype=torch.int32), torch.tensor(2), torch.tensor([], dtype=torch.long)],
    ids=["repeated", "int32", "0-dim", "empty"],
)
def test_index_select_matches_cpu(dim, index):
    expected = T.index_select(dim, index)
    actual = T.to(DEV).index_select(dim, index.to(DEV))
    same(actual, expected)
    assert actual.stride() == expected.stride()
    for out in (torch.empty_like(expected, device=DEV), torch.empty(0, device=DEV)):
        assert torch.index_select(T.to(DEV), dim, index.to(DEV), out=out) is out
        same(out, expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.arange(60.0, device=d).reshape(4, 5, 3).transpose(0, 1),  # non-contiguous: CPU's kernel
        lambda d: torch.arange(90000.0, device=d).reshape(300, 300),  # large: CPU's parallel kernel
        lambda d: torch.arange(6, device=d),  # a vector
        lambda d: torch.tensor(3.0, device=d),  # a scalar
        lambda d: torch.zeros(3, 0, device=d),  # empty slices
    ],
    ids=["transposed", "large", "vector", "scalar", "empty slices"],
)
def test_index_select_other_layouts_match_cpu(make):
    index = torch.tensor([0, 1, 0])
    self_cpu = make("cpu")
    if self_cpu.dim() == 0:
        index = torch.tensor([0])
    same(make(DEV).index_select(0, index.to(DEV)), self_cpu.index_select(0, index))


def test_embedding_matches_cpu_with_gradient():
    weight = torch.randn(10, 3)
    indices = torch.tensor([[1, 2], [4, 9], [1, 1]])
    grads = []
    for dev in ("cpu", DEV):
        w = weight.detach().to(dev).requires_grad_()
        out = torch.nn.functional.embedding(indices.to(dev), w)
        (out * torch.arange(18.0, device=dev).reshape(3, 2, 3)).sum().backward()
        grads.append((out.detach().cpu(), w.grad.cpu()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize(
    "index, error, match",
    [
        # Read by the kernel: as on CUDA, reported at the next synchronising call
        # (or at the call itself on a first launch).
        (torch.tensor([4]), (IndexError, torch.AcceleratorError), "index out of range in self"),
        (torch.tensor([-1]), (IndexError, torch.AcceleratorError), "index out of range in self"),
        (torch.tensor([0.5]), RuntimeError, "int32 or int64"),
        (torch.tensor([[0]]), IndexError, "Index is supposed to be a vector"),
    ],
)
def test_index_select_errors_match_cpu_and_keep_the_device_working(index, error, match):
    with pytest.raises(error, match=match):
        T.index_select(0, index)
    with pytest.raises(error, match=match):
        T.to(DEV).index_select(0, index.to(DEV))
        torch.openreg.synchronize()
    with pytest.raises(RuntimeError, match="same device"):
        T.to(DEV).index_select(0, torch.tensor([0]))
    same(T.to(DEV).index_select(0, torch.tensor([3], device=DEV)), T.index_select(0, torch.tensor([3])))


@pytest.mark.parametrize(
    "index",
    [
        (torch.tensor([0, 2]),),
        (torch.tensor([[0, 1], [2, 3]]),),
        (slice(None), torch.tensor([1, 3])),
        (torch.tensor([0, 2]), torch.tensor([1, 4])),
        (torch.tensor([-1]),),
        (T[:, :, 0] > 20,),
    ],
    ids=["list", "2-d", "second dim", "two indices", "negative", "mask"],
)
@pytest.mark.parametrize("where", ["openreg", "cpu"])
def test_getitem_matches_cpu_with_device_or_cpu_indices(index, where):
    moved = tuple(i.to(where) if isinstance(i, torch.Tensor) else i for i in index)
    for t in (T, T.double(), T.long()):
        same(t.to(DEV)[moved], t[index])


def test_getitem_out_of_range_raises():
    # The index values are read by the kernel: the error comes at the next
    # synchronisation (as on CUDA), or at the call on a first launch.
    with pytest.raises((IndexError, torch.AcceleratorError), match="out of bounds"):
        T.to(DEV)[torch.tensor([7], device=DEV)]
        torch.openreg.synchronize()
    same(T.to(DEV)[torch.tensor([1], device=DEV)], T[torch.tensor([1])])


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("where", ["openreg", "cpu"])
def test_index_put_matches_cpu(accumulate, deterministic, where):
    t = torch.zeros(5, 4)
    index = torch.tensor([0, 2, 2])
    values = torch.arange(12.0).reshape(3, 4)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        expected = t.clone().index_put_((index,), values, accumulate=accumulate)
        actual = t.to(DEV).index_put_((index.to(where),), values.to(DEV), accumulate=accumulate)
    finally:
        torch.use_deterministic_algorithms(before)
    same(actual, expected)


def test_setitem_with_scalars_masks_and_wrong_devices():
    x = torch.zeros(6, device=DEV)
    x[torch.tensor([1, 3], device=DEV)] = 5.0
    x[x > 1] = 2.0
    same(x, torch.tensor([0.0, 2.0, 0.0, 2.0, 0.0, 0.0]))
    with pytest.raises(RuntimeError, match="same device.*openreg:0 and cpu"):
        x.index_put_((torch.tensor([0, 1]),), torch.ones(2))  # values on the CPU, as CUDA refuses
    with pytest.raises(RuntimeError, match="same device"):
        x.index_put_((torch.tensor([0, 1]),), torch.ones(2, device="openreg:1"))
    same(x, torch.tensor([0.0, 2.0, 0.0, 2.0, 0.0, 0.0]))
