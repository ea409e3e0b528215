"""Operators whose torch CPU code runs on the device memory, against CPU:
those bound under `cpu_kernels` in backend_functions.yaml (their own CPU kernel
runs through a generated CpuKernelCall wrapper), and the `kernels` entries that call
torch's device-generic implementation (csrc/kernels/DeviceGeneric.cpp,
whose stubs run CPU kernels). Over PyTorch's OpInfo samples: contiguous and non-contiguous inputs, the
in-place and out= variants (an empty out= is resized, an out= of the wrong
dtype raises like CPU), zero-size inputs, and gradients. Each sample must
reach openreg's kernel, not the CPU fallback."""

import gc
import os
import re

import pytest
import torch
from torch.testing import assert_close
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

from test_structured_opinfo import CONFIG, aten_names, check_same, opinfo_id, run, to_cpu, to_device
from torch_openreg.info import classify

MODES = ("trace", "queue_all", "discrete")  # the extra CI passes that run this file (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV = "openreg"
DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16)
SAMPLES = 4

BOUND = sorted(str(c.name) for c in CONFIG.cpu_kernels)


def device_generic_kernels() -> dict[str, str]:
    """The `kernels` entries that run torch's device-generic implementation or
    an openreg one (DeviceGeneric.cpp, Index.cpp): operator -> kernel."""
    source = ""
    for name in ("DeviceGeneric.cpp", "Index.cpp"):
        with open(os.path.join(ROOT, "csrc", "kernels", name)) as f:
            source += f.read()
    defined = set(re.findall(r"^at::Tensor&? (\w+)\(", source, flags=re.M))
    return {str(k.name): k.kernel for k in CONFIG.kernels if k.kernel in defined}


GENERIC = device_generic_kernels()

# OpInfos about another operator than the bound one they reach (through a
# composite kernel), by the bound operator.
REACHES = {
    "nn.functional.conv2d": "convolution",
    "nn.functional.conv1d": "convolution",
    "nn.functional.max_pool2d": "max_pool2d_with_indices",
    "nn.functional.avg_pool2d": "avg_pool2d",
    "nn.functional.adaptive_avg_pool2d": "_adaptive_avg_pool2d",
    "nn.functional.embedding": "index_select",  # its composite kernel
    "nn.functional.batch_norm": "native_batch_norm",
    "nn.functional.layer_norm": "native_layer_norm",
    "nn.functional.hardtanh": "hardtanh",
    "nn.functional.relu": "relu",
    "nn.functional.linear": "addmm",
    "softmax": "_softmax",
    "log_softmax": "_log_softmax",
    "matmul": "mm",
    "masked_fill": "masked_fill_",  # CompositeExplicitAutograd: clone, then masked_fill_
    "index_put": "_index_put_impl_",
    "nn.functional.nll_loss": "nll_loss_forward",
}
ROOTS = {name.split(".")[0] for name in [*BOUND, *GENERIC]}


def reached(op) -> set[str]:
    """The operators an OpInfo's samples reach: those it is about
    (tests/test_structured_opinfo.py), or its REACHES entry."""
    return {REACHES[op.name]} if op.name in REACHES else aten_names(op)


# Random ops are compared with CPU's stream of the same seed in
# tests/test_generators.py; factories (arange, linspace) are checked by the
# tables below; sparse OpInfos reach the sparse fallback, not these routes
# (tests/test_opinfo.py and tests/test_sparse.py compare them).
NOT_HERE = ("normal", "bernoulli", "multinomial", "arange", "linspace")
OPINFOS = sorted(
    (
        op
        for op in op_db
        if reached(op) & ROOTS
        and op.name not in NOT_HERE
        and not op.name.startswith("sparse.")
        and any(d in op.supported_dtypes("cpu") for d in DTYPES)
    ),
    key=lambda op: (op.name, op.variant_test_name),
)


def samples(op, dtype, requires_grad=False):
    return list(op.sample_inputs("cpu", dtype, requires_grad=requires_grad))[:SAMPLES]


def dtypes_of(op):
    supported = op.supported_dtypes("cpu")
    return [d for d in DTYPES if d in supported]


@pytest.mark.parametrize("name", BOUND)
def test_bound_operator_is_served_by_the_generated_wrapper(name):
    report = classify(f"aten::{name}")
    assert report.category == "native", report
    assert report.served_by.startswith("cpu_kernel "), report


def test_device_generic_kernels_are_found():
    assert {"relu", "where.self", "logical_and.out", "masked_fill_.Scalar", "uniform_", "abs.out"} <= set(GENERIC)


@pytest.mark.parametrize("name", sorted(GENERIC))
def test_device_generic_operator_is_served_by_its_kernel(name):
    report = classify(f"aten::{name}")
    assert report.category == "native", report
    assert f"openreg::native::{GENERIC[name]}" in report.served_by, report


def test_bound_roots_have_opinfo_samples_or_are_listed_here():
    """An operator bound under cpu_kernels or a device-generic kernel is
    checked by an OpInfo, by the tables of this file, or by another test named
    here."""
    covered = {root for op in OPINFOS for root in reached(op)}
    elsewhere = {
        # tests/test_generators.py draws each against CPU's stream of the same seed.
        "uniform_", "normal_", "normal", "bernoulli", "bernoulli_", "random_", "exponential_", "multinomial",
        "randperm",
        # tests/test_async.py draws each against CPU's numbers of the same seed.
        "cauchy_", "log_normal_", "geometric_",
        # tests/test_training.py and the backward tables below.
        "convolution_backward", "max_pool2d_with_indices_backward", "avg_pool2d_backward",
        "_adaptive_avg_pool2d_backward", "native_batch_norm_backward", "native_layer_norm_backward",
        "_softmax_backward_data", "_log_softmax_backward_data", "hardtanh_backward", "embedding_dense_backward",
        "_native_batch_norm_legit", "_amp_update_scale_",
        # the FACTORIES table below.
        "arange", "linspace",
        # in-place or out= forms of covered operators, run with their OpInfo's variants.
        "cumsum_", "addmm_", "baddbmm_", "scatter_", "scatter_add_", "scatter_reduce_", "index_put_",
        "hardtanh_", "relu_", "index_add_", "index_copy_", "index_fill_", "masked_scatter_",
        "_index_put_impl_",
        # nn.functional.nll_loss's samples of more than two dimensions, and the
        # gradients of its samples (test_gradients_match_cpu).
        "nll_loss2d_forward", "nll_loss_backward", "nll_loss2d_backward",
        # tests/test_rnn.py: nn.LSTM's oneDNN route against CPU, bit for bit.
        "mkldnn_rnn_layer", "mkldnn_rnn_layer_backward",
    }
    missing = ROOTS - covered - elsewhere
    assert missing == set()


@pytest.mark.parametrize("op", OPINFOS, ids=opinfo_id)
def test_samples_match_cpu_and_do_not_fall_back(op):
    torch.openreg.reset_fallback_stats()
    ran = 0
    for dtype in dtypes_of(op):
        for sample in samples(op, dtype):
            check_same(op.op, sample)
            if op.inplace_variant is not None and isinstance(sample.input, torch.Tensor):
                check_same(op.inplace_variant, sample, clone_input=True)
            ran += 1
    assert ran > 0
    fell_back = {n for n in torch.openreg.fallback_stats() if n.split("::")[1].split(".")[0] in ROOTS}
    assert fell_back == set()


@pytest.mark.parametrize("op", OPINFOS, ids=opinfo_id)
def test_non_contiguous_samples_match_cpu(op):
    ran = 0
    for dtype in dtypes_of(op)[:2]:
        for sample in samples(op, dtype):
            check_same(op.op, sample.noncontiguous())
            ran += 1
    assert ran > 0


OUT_OPINFOS = [op for op in OPINFOS if op.supports_out]


def same_out_behaviour(op, sample, make_out):
    """Runs op with out= tensors made by make_out(result, device) on both
    devices; whatever CPU does (writes, resizes, casts or raises), openreg
    does. Returns False if the sample has no out= form."""
    expected, cpu_error = run(op.op, sample.input, *sample.args, **sample.kwargs)
    if cpu_error is not None or not isinstance(expected, (torch.Tensor, tuple)):
        return False
    results = expected if isinstance(expected, tuple) else (expected,)
    if not all(isinstance(r, torch.Tensor) for r in results):
        return False
    cpu_outs = tuple(make_out(r, "cpu") for r in results)
    dev_outs = tuple(make_out(r, DEV) for r in results)
    pick = (lambda o: o) if isinstance(expected, tuple) else (lambda o: o[0])
    got, cpu_error = run(op.op, sample.input, *sample.args, **sample.kwargs, out=pick(cpu_outs))
    result, dev_error = run(op.op, to_device(sample.input), *to_device(sample.args), **to_device(sample.kwargs), out=pick(dev_outs))
    if cpu_error is not None:
        assert dev_error is not None, f"CPU raised {cpu_error!r}, openreg did not"
        assert isinstance(dev_error, type(cpu_error)), f"CPU: {cpu_error!r}\nopenreg: {dev_error!r}"
        return True
    assert dev_error is None, f"openreg raised {dev_error!r}, CPU did not"
    assert result is pick(dev_outs) or all(a is b for a, b in zip(result, dev_outs))
    for d, c in zip(dev_outs, cpu_outs):
        assert_close(d.cpu(), c, equal_nan=True)
    return True


@pytest.mark.parametrize("op", OUT_OPINFOS, ids=opinfo_id)
def test_out_is_resized_like_cpu(op):
    ran = [same_out_behaviour(op, s, lambda r, d: torch.empty(0, dtype=r.dtype, device=d)) for s in samples(op, dtypes_of(op)[0])]
    assert any(ran)


@pytest.mark.parametrize("op", OUT_OPINFOS, ids=opinfo_id)
def test_out_of_another_dtype_casts_or_raises_like_cpu(op):
    def wrong(r, device):
        dtype = torch.complex128 if r.dtype != torch.complex128 else torch.float32
        return torch.empty(r.shape, dtype=dtype, device=device)

    ran = [same_out_behaviour(op, s, wrong) for s in samples(op, dtypes_of(op)[0])]
    assert any(ran)


GRAD_OPINFOS = [op for op in OPINFOS if op.supports_autograd and torch.float64 in op.supported_dtypes("cpu")]


def grads(op, sample, device):
    """The result and the gradients of every floating input that requires grad."""
    moved = tree_map(
        lambda v: v.detach().to(device).requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v,
        (sample.input, sample.args, sample.kwargs),
    )
    inp, args, kwargs = moved
    leaves = [t for t in tree_flatten(moved)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    out = op.op(inp, *args, **kwargs)
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs or not leaves:
        return None
    total = sum((o.to(torch.float64) * torch.linspace(0.5, 1.5, o.numel(), device=device, dtype=torch.float64).reshape(o.shape)).sum() for o in outs)
    return torch.autograd.grad(total, leaves, allow_unused=True)


@pytest.mark.parametrize("op", GRAD_OPINFOS, ids=opinfo_id)
def test_gradients_match_cpu(op):
    compared = 0
    for sample in samples(op, torch.float64, requires_grad=True):
        expected = grads(op, sample, "cpu")
        if expected is None:
            continue
        actual = grads(op, sample, DEV)
        for a, e in zip(actual, expected):
            if e is None:
                assert a is None
            else:
                assert a.device.type == DEV
                assert_close(a.cpu(), e)
        compared += 1
    assert compared > 0


# Zero-size inputs of the families OpInfo samples rarely make empty.
ZERO_SIZE = {
    "mm": lambda d: torch.mm(torch.ones(0, 3, device=d), torch.ones(3, 2, device=d)),
    "mm.k0": lambda d: torch.mm(torch.ones(2, 0, device=d), torch.ones(0, 3, device=d)),
    "bmm": lambda d: torch.bmm(torch.ones(0, 2, 3, device=d), torch.ones(0, 3, 4, device=d)),
    "cat": lambda d: torch.cat([torch.ones(0, 3, device=d), torch.ones(2, 3, device=d)]),
    "index_select": lambda d: torch.ones(3, 4, device=d).index_select(0, torch.zeros(0, dtype=torch.long, device=d)),
    "sort": lambda d: torch.sort(torch.ones(0, device=d)),
    "topk": lambda d: torch.topk(torch.ones(3, device=d), 0),
    "cumsum": lambda d: torch.cumsum(torch.ones(0, 2, device=d), 0),
    "softmax": lambda d: torch.softmax(torch.ones(0, 4, device=d), 1),
    "mean": lambda d: torch.ones(0, 4, device=d).mean(0),
    "argmax": lambda d: torch.ones(0, 4, device=d).argmax(1),
    "masked_select": lambda d: torch.ones(0, device=d).masked_select(torch.ones(0, dtype=torch.bool, device=d)),
    "arange": lambda d: torch.arange(0, device=d),
    "where": lambda d: torch.where(torch.ones(0, dtype=torch.bool, device=d), torch.ones(0, device=d), 1.0),
    "embedding": lambda d: torch.nn.functional.embedding(torch.zeros(0, dtype=torch.long, device=d), torch.ones(3, 2, device=d)),
    "conv2d": lambda d: torch.nn.functional.conv2d(torch.ones(0, 1, 4, 4, device=d), torch.ones(1, 1, 3, 3, device=d)),
}


@pytest.mark.parametrize("name", sorted(ZERO_SIZE))
def test_zero_size_inputs_match_cpu(name):
    expected = ZERO_SIZE[name]("cpu")
    actual = ZERO_SIZE[name](DEV)
    assert_close(to_cpu(actual), expected, equal_nan=True)


FACTORIES = {
    "arange": lambda d: torch.arange(2, 20, 3, device=d),
    "arange.float": lambda d: torch.arange(0.0, 1.0, 0.125, dtype=torch.float64, device=d),
    "arange.out": lambda d: torch.arange(5, out=torch.empty(0, dtype=torch.int32, device=d)),
    "linspace": lambda d: torch.linspace(-1, 1, 7, device=d),
    "linspace.int": lambda d: torch.linspace(0, 10, 4, dtype=torch.int64, device=d),
    "linspace.out": lambda d: torch.linspace(0, 1, 3, out=torch.empty(9, device=d)[::3]),
    "arange.strided_out": lambda d: torch.arange(6, out=torch.empty(12, device=d)[::2]),
    "arange.half": lambda d: torch.arange(-3, 50, 0.7, dtype=torch.float16, device=d),
    "arange.bfloat16": lambda d: torch.arange(-3, 50, 0.7, dtype=torch.bfloat16, device=d),
    "arange.int8": lambda d: torch.arange(100, -100, -3, dtype=torch.int8, device=d),
    "linspace.bfloat16": lambda d: torch.linspace(-3, 50, 77, dtype=torch.bfloat16, device=d),
    "linspace.one": lambda d: torch.linspace(2, 5, 1, device=d),
    "linspace.zero": lambda d: torch.linspace(2, 5, 0, device=d),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_match_cpu(name):
    actual = FACTORIES[name](DEV)
    assert actual.device.type == DEV
    assert_close(actual.cpu(), FACTORIES[name]("cpu"), rtol=0, atol=0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: torch.arange(0, 5, 0, device=DEV), "step must be nonzero"),
        (lambda: torch.arange(5, 0, 1, device=DEV), "upper bound and lower bound inconsistent with step sign"),
        (lambda: torch.linspace(0, 1, -1, device=DEV), "number of steps must be non-negative"),
    ],
)
def test_factories_with_bad_arguments_raise_cpus_error(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
    assert torch.arange(3, device=DEV).tolist() == [0, 1, 2]


def test_mixed_devices_raise_the_same_device_error():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*openreg:0 and cpu"):
        torch.mm(torch.ones(2, 2, device=DEV), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="openreg:0 and openreg:1"):
        torch.cat([torch.ones(2, device="openreg:0"), torch.ones(2, device="openreg:1")])


def test_cpu_indices_are_accepted_where_cuda_accepts_them():
    t = torch.arange(6.0).reshape(2, 3)
    index = torch.tensor([1, 0])
    assert_close(t.to(DEV)[index].cpu(), t[index])


def test_results_run_on_the_operands_device_and_adopt_its_memory():
    with torch.openreg.device(0):
        a = torch.randn(64, 64, device="openreg:1")
        before = torch.openreg.memory_allocated(1)
        r = a @ a
    assert r.device == torch.device("openreg:1")
    assert torch.openreg.memory_allocated(1) >= before + r.numel() * 4
    assert_close(r.cpu(), a.cpu() @ a.cpu())


def test_out_of_another_shape_is_resized_and_returned_as_the_callers_tensors():
    t = torch.randn(5, device=DEV)
    values = torch.empty(0, device=DEV)
    indices = torch.empty(0, dtype=torch.long, device=DEV)
    r = torch.sort(t, out=(values, indices))
    assert r[0] is values and r[1] is indices
    assert values.shape == (5,)
    assert_close(values.cpu(), torch.sort(t.cpu()).values)


def test_generated_wrappers_give_no_memory_back_to_the_cpu_allocator():
    """Fresh results use the device memory the CPU kernel allocated: no copy
    doubles the memory, and freeing the result gives all of it back."""
    a = torch.randn(256, 256, device=DEV)
    gc.collect()  # earlier tests' garbage, freed now rather than during the count
    torch.openreg.synchronize()
    base = torch.openreg.memory_allocated()
    r = torch.cat([a, a])
    assert torch.openreg.memory_allocated() - base == r.numel() * 4
    del r
    assert torch.openreg.memory_allocated() == base
