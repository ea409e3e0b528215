"""Sparse tensors on openreg (COO, CSR, CSC, BSR, BSC): every operator on them
runs torch's SparseCPU / SparseCsrCPU kernel on their indices and values in
device memory (the sparse CPU fallback), so results are CPU's, bit for bit,
and stay sparse openreg tensors. CPU is the oracle throughout."""

import gc
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

MODES = ("trace", "discrete")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"

# torch warns that the compressed layouts are in beta.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse (CSR|CSC|BSR|BSC) tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
]

COMPRESSED = {
    torch.sparse_csr: lambda t: t.to_sparse_csr(),
    torch.sparse_csc: lambda t: t.to_sparse_csc(),
    torch.sparse_bsr: lambda t: t.to_sparse_bsr((2, 2)),
    torch.sparse_bsc: lambda t: t.to_sparse_bsc((2, 2)),
}


def coo(size=(4, 6), nnz=7, dtype=torch.float64, coalesced=False, dense_dims=(), seed=0):
    """A COO tensor on CPU; uncoalesced ones repeat indices (duplicates sum)."""
    g = torch.Generator().manual_seed(seed)
    indices = torch.stack([torch.randint(0, s, (nnz,), generator=g) for s in size])
    if nnz > 1:
        indices[:, -1] = indices[:, 0]  # a duplicate
    values = torch.randn(nnz, *dense_dims, generator=g, dtype=dtype)
    t = torch.sparse_coo_tensor(indices, values, (*size, *dense_dims))
    return t.coalesce() if coalesced else t


def dense(*size, dtype=torch.float64, seed=1, density=0.5):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*size, generator=g, dtype=dtype)
    return t * (torch.rand(*size, generator=g) < density)


def members(t):
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]


def assert_same(dev, cpu):
    """`dev` is on openreg, of `cpu`'s layout and holds exactly its members."""
    assert dev.device.type == "openreg", f"result on {dev.device}"
    assert dev.layout == cpu.layout and dev.dtype == cpu.dtype and dev.shape == cpu.shape
    if cpu.layout == torch.strided:
        torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)
        return
    if cpu.layout == torch.sparse_coo:
        assert dev.is_coalesced() == cpu.is_coalesced()
        assert (dev.sparse_dim(), dev.dense_dim()) == (cpu.sparse_dim(), cpu.dense_dim())
    for d, c in zip(members(dev), members(cpu), strict=True):
        assert d.device.type == "openreg" and d.layout == torch.strided
        assert d.dtype == c.dtype
        torch.testing.assert_close(d.cpu(), c, rtol=0, atol=0, equal_nan=True)


# --- moving and making sparse tensors ---


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("coalesced", [False, True])
@pytest.mark.parametrize("nnz", [0, 7])
def test_coo_tensor_moves_to_openreg_and_back_unchanged(dtype, coalesced, nnz):
    cpu = coo(nnz=nnz, dtype=dtype, coalesced=coalesced)
    dev = cpu.to(DEV)
    assert dev.is_sparse and dev.layout == torch.sparse_coo and dev.device == torch.device(DEV, 0)
    assert_same(dev, cpu)
    back = dev.cpu()
    assert back.device.type == "cpu" and back.is_sparse
    assert_same(back.to(DEV), cpu)
    assert torch.equal(back.to_dense(), cpu.to_dense())


def test_indices_and_values_of_an_openreg_coo_tensor_are_openreg_tensors_sharing_its_memory():
    dev = coo(coalesced=True).to(DEV)
    values = dev.values()
    assert values.device.type == "openreg" and dev.indices().device.type == "openreg"
    values.mul_(2)  # a view of the tensor's own values
    torch.testing.assert_close(dev.cpu().values(), coo(coalesced=True).values() * 2, rtol=0, atol=0)


@pytest.mark.parametrize("layout", list(COMPRESSED))
def test_compressed_tensor_moves_to_openreg_and_back_unchanged(layout):
    cpu = COMPRESSED[layout](dense(4, 6))
    dev = cpu.to(DEV)
    assert dev.layout == layout and dev.is_sparse_csr == (layout == torch.sparse_csr)
    assert_same(dev, cpu)
    assert_same(dev.cpu().to(DEV), cpu)
    assert torch.equal(dev.to_dense().cpu(), cpu.to_dense())


def test_copy_between_openreg_devices_keeps_the_members():
    if torch.openreg.device_count() < 2:
        pytest.skip("needs two openreg devices")
    cpu = coo()
    one = cpu.to(DEV).to("openreg:1")
    assert one.device == torch.device("openreg", 1) and one._values().device == torch.device("openreg", 1)
    assert_same(one, cpu)
    assert_same(one.to("openreg:0"), cpu)
    csr = dense(4, 6).to_sparse_csr()
    assert_same(csr.to(DEV).to("openreg:1"), csr)


def test_constructors_with_an_openreg_device_make_openreg_sparse_tensors():
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    v = torch.tensor([3.0, 4.0, 5.0])
    assert_same(torch.sparse_coo_tensor(i, v, (2, 3), device=DEV), torch.sparse_coo_tensor(i, v, (2, 3)))
    assert_same(torch.sparse_coo_tensor(i.to(DEV), v.to(DEV), (2, 3)), torch.sparse_coo_tensor(i, v, (2, 3)))
    crow, col = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1])
    assert_same(torch.sparse_csr_tensor(crow, col, v, (2, 3), device=DEV), torch.sparse_csr_tensor(crow, col, v, (2, 3)))
    assert_same(torch.sparse_csc_tensor(crow, col, v, (3, 2), device=DEV), torch.sparse_csc_tensor(crow, col, v, (3, 2)))
    empty = torch.empty(2, 3, device=DEV, layout=torch.sparse_coo)
    assert_same(empty, torch.empty(2, 3, layout=torch.sparse_coo))
    assert_same(torch.zeros(2, 3, device=DEV, layout=torch.sparse_coo), torch.zeros(2, 3, layout=torch.sparse_coo))


def test_constructor_checks_indices_against_the_size_as_cpu_does():
    i = torch.tensor([[0, 5]])
    with pytest.raises(RuntimeError, match="inconsistent with indices") as cpu:
        torch.sparse_coo_tensor(i, torch.ones(2), (3,), check_invariants=True)
    with pytest.raises(RuntimeError) as dev:
        torch.sparse_coo_tensor(i, torch.ones(2), (3,), device=DEV, check_invariants=True)
    assert str(dev.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    # Indices in bounds pass the same checks and make the tensor.
    made = torch.sparse_coo_tensor(i, torch.ones(2), (6,), device=DEV, check_invariants=True)
    assert_same(made, torch.sparse_coo_tensor(i, torch.ones(2), (6,), check_invariants=True))


def test_constructor_checks_a_claim_of_coalesced_indices_as_cpu_does():
    size, values = (3, 4, 2), torch.ones(2, 2)
    coalesced, repeated = torch.tensor([[0, 2], [1, 3]]), torch.tensor([[2, 2], [3, 3]])
    made = torch.sparse_coo_tensor(coalesced, values, size, device=DEV, is_coalesced=True, check_invariants=True)
    assert_same(made, torch.sparse_coo_tensor(coalesced, values, size, is_coalesced=True, check_invariants=True))
    with pytest.raises(RuntimeError, match="cannot set is_coalesced to true") as cpu:
        torch.sparse_coo_tensor(repeated, values, size, is_coalesced=True, check_invariants=True)
    with pytest.raises(RuntimeError) as dev:
        torch.sparse_coo_tensor(repeated, values, size, device=DEV, is_coalesced=True, check_invariants=True)
    assert str(dev.value).splitlines()[0] == str(cpu.value).splitlines()[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_to_sparse_layouts_of_an_openreg_tensor_match_cpu(dtype):
    cpu = dense(4, 6, dtype=dtype)
    dev = cpu.to(DEV)
    assert_same(dev.to_sparse(), cpu.to_sparse())
    assert_same(dev.to_sparse(1), cpu.to_sparse(1))
    for layout, convert in COMPRESSED.items():
        assert_same(convert(dev), convert(cpu))
    assert_same(dev.to_sparse().to_sparse_csr(), cpu.to_sparse().to_sparse_csr())
    assert_same(dev.to_sparse_csr().to_sparse(), cpu.to_sparse_csr().to_sparse())


@pytest.mark.parametrize("coalesced", [False, True])
def test_to_dense_matches_cpu(coalesced):
    cpu = coo(coalesced=coalesced, dense_dims=(3,))
    assert_same(cpu.to(DEV).to_dense(), cpu.to_dense())
    assert_same(coo(nnz=0).to(DEV).to_dense(), coo(nnz=0).to_dense())


# --- operators ---

with warnings.catch_warnings():  # pytestmark's filters do not cover the import
    warnings.simplefilter("ignore")
    S = coo(size=(4, 6), nnz=9)  # uncoalesced
    S2 = coo(size=(4, 6), nnz=5, seed=3)
    D = dense(6, 3, density=1.0)
    D4 = dense(4, 6, density=1.0, seed=4)
    CSR = dense(4, 6, seed=5).to_sparse_csr()

OPS = {
    "mm_sparse_dense": (lambda s, d: torch.mm(s, d), (S, D)),
    "sparse_mm": (lambda s, d: torch.sparse.mm(s, d), (S, D)),
    "sparse_mm_sparse": (lambda a, b: torch.sparse.mm(a, b), (S, S2.t().coalesce())),
    "addmm": (lambda m, s, d: torch.addmm(m, s, d, beta=0.5, alpha=2.0), (dense(4, 3, density=1.0), S, D)),
    "matmul": (lambda s, d: s @ d, (S, D)),
    "add_sparse_sparse": (lambda a, b: a + b, (S, S2)),
    "add_dense_sparse": (lambda a, b: a + b, (D4, S)),
    "sub": (lambda a, b: a - b, (S, S2)),
    "mul_sparse_sparse": (lambda a, b: a * b, (S.coalesce(), S2.coalesce())),
    "mul_scalar": (lambda a: a * 2.5, (S,)),
    "neg": (lambda a: -a, (S,)),
    "sum": (lambda a: torch.sum(a), (S,)),
    "sparse_sum_dim": (lambda a: torch.sparse.sum(a, dim=1), (S,)),
    "coalesce": (lambda a: a.coalesce(), (S,)),
    "index_select": (lambda a: a.index_select(1, torch.tensor([5, 0, 5, 2]).to(a.device)), (S,)),
    "transpose": (lambda a: a.t(), (S,)),
    "narrow_copy": (lambda a: a.narrow_copy(1, 1, 3), (S,)),
    "softmax": (lambda a: torch.sparse.softmax(a.coalesce(), 1), (S,)),
    "abs": (lambda a: a.abs(), (S,)),
    "csr_mm": (lambda s, d: s @ d, (CSR, D)),
    "csr_addmm": (lambda m, s, d: torch.addmm(m, s, d), (dense(4, 3, density=1.0), CSR, D)),
    "csr_add": (lambda a, b: a + b, (CSR, dense(4, 6, seed=6).to_sparse_csr())),
    "csr_mul_scalar": (lambda a: a * 3.0, (CSR,)),
    "csr_sum": (lambda a: a.sum(), (CSR,)),
    "sampled_addmm": (
        lambda c, a, b: torch.sparse.sampled_addmm(c, a, b),
        (CSR, dense(4, 5, density=1.0), dense(5, 6, density=1.0)),
    ),
}


@pytest.mark.parametrize("name", list(OPS))
def test_sparse_operators_match_cpu_bit_for_bit(name):
    fn, args = OPS[name]
    expected = fn(*args)
    got = fn(*(a.to(DEV) for a in args))
    assert_same(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_nnz_operands_match_cpu(dtype):
    a, d = coo(nnz=0, dtype=dtype), dense(6, 2, dtype=dtype)
    dev = a.to(DEV)
    assert_same(dev @ d.to(DEV), a @ d)
    assert_same(dev + dev, a + a)
    assert_same(dev.coalesce(), a.coalesce())
    assert_same(torch.sum(dev), torch.sum(a))


def test_in_place_operators_update_the_openreg_tensor():
    cpu, other = coo(), coo(nnz=4, seed=9)
    dev = cpu.to(DEV)
    cpu.add_(other)
    dev.add_(other.to(DEV))
    assert_same(dev, cpu)
    cpu.mul_(0.5)
    dev.mul_(0.5)
    assert_same(dev, cpu)
    target = dense(4, 6).to(DEV)
    expected = dense(4, 6).add_(cpu, alpha=3)
    target.add_(dev, alpha=3)  # a dense tensor plus a sparse one, in place
    assert_same(target, expected)
    cpu.zero_()
    dev.zero_()
    assert_same(dev, cpu)


OUT_INTO_EMPTY = {  # CPU kernels that resize (and narrow) the out= tensor's indices and values in place
    "asin": lambda a, out: torch.asin(a, out=out),
    "sqrt": lambda a, out: torch.sqrt(a, out=out),
    "mul_scalar": lambda a, out: torch.mul(a, torch.tensor(2.0, dtype=a.dtype, device=a.device), out=out),
    "div_scalar": lambda a, out: torch.div(a, torch.tensor(2.0, dtype=a.dtype, device=a.device), out=out),
    "add": lambda a, out: torch.add(torch.zeros_like(a), a, out=out),
    "add_": lambda a, out: out.add_(a),
    "sub_": lambda a, out: out.sub_(a),
}


@pytest.mark.parametrize("name", list(OUT_INTO_EMPTY))
def test_results_written_into_an_empty_sparse_tensor_match_cpu(name):
    fn, cpu = OUT_INTO_EMPTY[name], coo(coalesced=True).abs()
    expected, out = torch.zeros_like(cpu), torch.zeros_like(cpu).to(DEV)
    expected_values, values = expected._values(), out._values()  # on the storage the kernel may resize
    assert fn(cpu, expected) is expected and fn(cpu.to(DEV), out) is out
    assert_same(out, expected)
    assert_same(values, expected_values)


def test_copy_from_a_cpu_sparse_tensor_into_an_openreg_one():
    src = coo(seed=11)
    dst = coo(nnz=2).to(DEV)
    dst.copy_(src)
    assert_same(dst, src)


def test_copy_between_openreg_devices_and_back_to_cpu():
    if torch.openreg.device_count() < 2:
        pytest.skip("needs two openreg devices")
    src = coo(seed=12)
    dst = coo(nnz=2).to("openreg:1")
    dst.copy_(src.to(DEV))  # as on CUDA: copy_ takes a source on another device
    assert dst.device == torch.device("openreg", 1) and dst._values().device == dst.device
    assert_same(dst, src)
    back = coo(nnz=3)
    back.copy_(dst)
    assert back.device.type == "cpu" and back._values().device.type == "cpu"
    assert_same(back.to(DEV), src)
    csr = dense(4, 6).to_sparse_csr()
    dst_csr = (csr * 2).to("openreg:1")  # CPU's CSR copy_ needs the same number of elements
    dst_csr.copy_(csr.to(DEV))
    assert_same(dst_csr, csr)


# --- autograd ---


def test_autograd_through_to_dense_and_sparse_mm_matches_cpu():
    def run(device):
        # Clones: .to("cpu") of a CPU tensor is the tensor itself.
        s = S.clone().to(device).requires_grad_()
        d = D.clone().to(device).requires_grad_()
        out = torch.sparse.mm(s, d)
        (out * out).sum().backward()
        v = S.coalesce().to(device).requires_grad_()
        (v.to_dense() ** 2).sum().backward()
        return s.grad, d.grad, v.grad

    for dev, cpu in zip(run(DEV), run("cpu"), strict=True):
        assert_same(dev, cpu)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda p: torch.optim.SGD(p, lr=0.1),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.Adagrad(p, lr=0.1),
        lambda p: torch.optim.SparseAdam(p, lr=0.01),
    ],
    ids=["sgd", "sgd_momentum", "adagrad", "sparse_adam"],
)
def test_sparse_embedding_training_matches_cpu(make_optimizer):
    def train(device):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        head = torch.nn.Linear(3, 1)
        emb.to(device)
        head.to(device)
        opt = make_optimizer(list(emb.parameters()))
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            idx = torch.randint(0, 10, (5, 2), generator=g).to(device)
            opt.zero_grad()
            loss = head(emb(idx)).square().mean()
            loss.backward()
            assert emb.weight.grad.is_sparse and emb.weight.grad.device.type == device
            opt.step()
        return emb.weight.detach()

    assert_same(train(DEV), train("cpu"))


def test_embedding_bag_sparse_gradient_matches_cpu():
    def grad(device):
        torch.manual_seed(0)
        bag = torch.nn.EmbeddingBag(10, 3, mode="sum", sparse=True).to(device)
        idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]).to(device)
        offsets = torch.tensor([0, 4]).to(device)
        bag(idx, offsets).sum().backward()
        return bag.weight.grad

    assert_same(grad(DEV), grad("cpu"))


# --- serialization ---


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_save_and_load_keep_an_openreg_sparse_tensor(layout):
    cpu = coo(coalesced=True) if layout == torch.sparse_coo else CSR
    buf = io.BytesIO()
    torch.save(cpu.to(DEV), buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert_same(loaded, cpu)
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu.to_dense(), cpu.to_dense())


# --- errors, modes, observation ---


def test_operator_without_a_sparse_cpu_kernel_raises_not_implemented_naming_it():
    dev = coo().to(DEV)
    with pytest.raises(NotImplementedError, match=r"aten::cumsum got a torch\.sparse_coo tensor on openreg.*no SparseCPU kernel"):
        torch.cumsum(dev, 0)
    # CPU has no kernel either: openreg never answers where CPU cannot.
    with pytest.raises((NotImplementedError, RuntimeError)):
        torch.cumsum(coo(), 0)


def test_mixed_devices_raise_torchs_device_error():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(S.to(DEV), D)
    if torch.openreg.device_count() >= 2:
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            S.to(DEV) + S.to("openreg:1")


def test_fallback_mode_error_forbids_the_sparse_fallback():
    dev = coo().to(DEV)
    torch.openreg.set_fallback_mode("error")
    try:
        with pytest.raises(NotImplementedError, match=r"aten::.*sparse CPU fallback.*OPENREG_FALLBACK=error"):
            dev.coalesce()
    finally:
        torch.openreg.set_fallback_mode("silent")


def test_sparse_operators_are_counted_as_fallbacks():
    dev = coo().to(DEV)
    torch.openreg.reset_fallback_stats()
    torch.mm(dev, D.to(DEV))
    stats = torch.openreg.fallback_stats()
    assert any(name.startswith("aten::_sparse_mm") or name.startswith("aten::mm") or "addmm" in name
               for name in stats), stats


def test_sparse_operators_are_traced_under_their_dispatch_keys():
    code = (
        "import torch, warnings; warnings.simplefilter('ignore')\n"
        "s = torch.sparse_coo_tensor(torch.tensor([[0, 0]]), torch.ones(2), (2,)).to('openreg')\n"
        "s.coalesce()\n"
        "torch.ones(2, 2).to_sparse_csr().to('openreg') * 2\n"
    )
    env = dict(os.environ, TORCH_SHOW_DISPATCH_TRACE="1")
    err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stderr
    assert "op=[aten::_coalesce], key=[SparsePrivateUse1] -> sparse_fallback" in err
    assert "key=[SparseCsrPrivateUse1] -> sparse_fallback" in err


def test_memory_goes_back_after_the_sparse_tensors_are_dropped():
    gc.collect()  # earlier tests' garbage, freed now rather than during the count
    torch.openreg.synchronize()
    before = torch.openreg.memory_allocated()
    s = coo(size=(100, 100), nnz=500).to(DEV)
    r = (s + s).coalesce() @ dense(100, 4).to(DEV)
    assert torch.openreg.memory_allocated() > before
    del s, r
    torch.openreg.synchronize()
    assert torch.openreg.memory_allocated() == before


def test_info_reports_how_sparse_operators_are_served():
    from torch_openreg import info

    assert info.sparse_route("aten::_coalesce") == "sparse_fallback"
    assert info.sparse_route("aten::_to_copy") == "composite"
    assert info.sparse_route("aten::cumsum") == "unsupported"
    assert info.classify("aten::_sparse_coo_tensor_with_dims_and_tensors").sparse == "sparse_fallback"
