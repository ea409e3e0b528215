"""Time operators on CPU and on openreg in the same run and print the ratio.

    python benchmarks/bench_ops.py [--size small|large|both] [--only add,sort,...]
                                   [--repeat N] [--calls-scale F] [--json FILE]
                                   [--sanitizer] [--record-memory-history]

Each case runs interleaved: pairs of batches, a batch of calls on CPU and one
on openreg, in alternating order (CPU first, then openreg first; the device is
synchronized at the end of every batch). The table gives each device's median
per-call time, and ratio = openreg / CPU (1.0 = as fast as CPU): the median of
the pairs' ratios, with their first and third quartile as the spread. Copies
are also reported as GB/s, against CPU's copy_ bandwidth.

Small inputs have 16 elements, large ones about 16M; the shape column gives
the shape of the first tensor argument (of the result for arange, linspace,
randperm). Matrix products use 4x4 and 2048x2048 matrices (batches of 1x4x4 and
64x512x512), convolution and pooling 1x1x4x4 and 16x64x128x128 images. The
call column says how each case calls the operator:

- fn: the functional call, which allocates its output. On small inputs that
  per-call overhead is what is measured; on large inputs "fn" is used only where
  the output is small (full reductions, reductions over one dimension).
- out=: large inputs write into an output preallocated on both devices. A
  functional call would allocate a fresh 64 MB output on each call, which on
  CPU goes through malloc and page faults while openreg's caching allocator
  reuses a block: the ratio would measure allocation, not the kernel.
- alloc: large inputs, functional call with a large output, because the
  operator has no out= form (relu, clone, linear, embedding, conv2d,
  max_pool2d). The ratio includes allocating the output (cheaper on openreg).
- in-place: the operator writes into its input (fill_, uniform_, copy_, ...).

The label after each name comes from the dispatcher at run time
(torch_openreg.info.classify of the aten operator that decides how openreg
runs the case): native, fallback (the CPU fallback), or composite (runs
through other operators). The summary gives, per group, the median and worst
ratio and how many cases meet the project's goals: native ops at most 1.10x
CPU on small inputs and 1.05x on large ones, fallback ops 2.0x and 1.3x,
copies at least 0.9x of CPU's copy_ bandwidth. These are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from torch_openreg import info  # also registers the device when autoload is off
from torch_openreg.openreg import diagnostics

DEV = "openreg"
SMALL_CALLS = 200  # calls per timed batch on small inputs (0.3-1 ms)
# Pairs of batches per case. Small inputs take many short pairs: a burst of a
# neighbour's load then spoils few of them, and their median moves less
# between runs (docs/performance.md, Measuring). Large ones, whose batches are
# 1-3 calls of up to 0.4 s, take 21 (about 9 minutes in all).
REPEAT = {"small": 111, "large": 21}
CALL_KINDS = ("fn", "out=", "alloc", "in-place")
COPY_KINDS = {"h2d": (False, True), "d2h": (True, False), "d2d": (True, True)}  # (src, dst) on openreg


class _Device:
    """Stands for the device among a case's arguments (factories take no tensor)."""

    def __repr__(self) -> str:
        return "DEVICE"


DEVICE = _Device()


@dataclass(frozen=True)
class Case:
    """One operator call, timed on small and on large inputs."""

    name: str
    op: str  # the aten operator that decides how openreg runs the call
    inputs: Callable[[bool], tuple]  # the call's CPU arguments, small (False) or large (True)
    fn: Callable[..., object]  # the call; takes out= when large == "out=" and out is None
    large: str = "out="  # how the large case calls: one of CALL_KINDS
    out: Callable[..., object] | None = None  # the out= call, when fn has no out= keyword
    calls: int = 3  # calls per timed batch on large inputs
    copy: str | None = None  # a copy_ of args (src, dst): which of them are on openreg

    def __post_init__(self) -> None:
        if self.large not in CALL_KINDS:
            raise ValueError(f"case {self.name}: large={self.large!r}; use one of {CALL_KINDS}")
        if self.out is not None and self.large != "out=":
            raise ValueError(f"case {self.name}: out= call given but large={self.large!r}; set large='out='")
        if not self.op.startswith("aten::"):
            raise ValueError(f"case {self.name}: op {self.op!r} should name an aten operator, e.g. 'aten::add.out'")
        if self.copy is not None and self.copy not in COPY_KINDS:
            raise ValueError(f"case {self.name}: copy={self.copy!r}; use one of {tuple(COPY_KINDS)}")
        if self.calls < 1:
            raise ValueError(f"case {self.name}: calls={self.calls}; time at least one call per batch")

    def call(self, large: bool) -> str:
        """How the case calls the operator on small or large inputs (a CALL_KINDS entry)."""
        if large or self.large == "in-place":
            return self.large
        return "fn"


# Inputs. N: vectors of 16 and 16M elements; M: matrices of 16 and 16M elements
# (reductions over dim 1, sort, softmax, indexing along a dimension).
N = (16, 1 << 24)
M = ((4, 4), (4096, 4096))
MM = ((4, 4), (2048, 2048))
BMM = ((1, 4, 4), (64, 512, 512))
IMAGE = ((1, 1, 4, 4), (16, 64, 128, 128))  # conv2d and pooling input
FILTER = ((1, 1, 3, 3), (64, 64, 3, 3))
EMBEDDING = ((4, 4), (32768, 512))  # (rows, dim) of the weight; as many lookups as rows


def vec(large: bool) -> torch.Tensor:
    return torch.randn(N[large])


def positive(large: bool) -> torch.Tensor:
    return torch.rand(N[large]) + 0.5


def mask(large: bool) -> torch.Tensor:
    return torch.rand(N[large]) < 0.5


def mat(large: bool) -> torch.Tensor:
    return torch.randn(M[large])


def one(make: Callable[[bool], Any]) -> Callable[[bool], tuple]:
    return lambda large: (make(large),)


def two(make: Callable[[bool], Any], other: Callable[[bool], Any] | None = None) -> Callable[[bool], tuple]:
    return lambda large: (make(large), (other or make)(large))


def half(large: bool) -> torch.Tensor:
    return torch.randn(N[large] // 2)


def int32s(large: bool) -> torch.Tensor:
    return torch.randint(0, 1 << 30, (N[large],), dtype=torch.int32)


def rows_index(large: bool) -> tuple:
    """A matrix and a random index of the same shape into its columns."""
    m = mat(large)
    return m, torch.randint(0, m.shape[1], m.shape)


def vector_index(large: bool) -> tuple:
    """A vector and as many random positions into it."""
    return vec(large), torch.randint(0, N[large], (N[large],))


def softmax_backward_inputs(log: bool) -> Callable[[bool], tuple]:
    def make(large: bool) -> tuple:
        x = mat(large)
        return torch.randn_like(x), (torch.log_softmax if log else torch.softmax)(x, -1)
    return make


def mm_inputs(shapes: tuple, bias: bool) -> Callable[[bool], tuple]:
    def make(large: bool) -> tuple:
        a, b = torch.randn(shapes[large]), torch.randn(shapes[large])
        return (torch.randn(shapes[large]), a, b) if bias else (a, b)
    return make


def linear_inputs(large: bool) -> tuple:
    rows, cols = MM[large]
    return torch.randn(rows, cols), torch.randn(cols, cols), torch.randn(cols)


def embedding_inputs(large: bool) -> tuple:
    rows, dim = EMBEDDING[large]
    return torch.randn(rows, dim), torch.randint(0, rows, (rows,))


def aten_out(overload: Any, *const: Any, out_name: str = "out") -> Callable[..., object]:
    """The out= call of an aten overload: (tensors..., out=) -> overload(tensors..., *const, out_name=out)."""
    return lambda *tensors, out: overload(*tensors, *const, **{out_name: out})


UNARY = ("abs", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf")
POSITIVE = {"log", "sqrt", "rsqrt"}
BINARY = {  # name: the out= overload of the aten operator
    "add": "add.out", "sub": "sub.out", "mul": "mul.out", "div": "div.out",
    "maximum": "maximum.out", "minimum": "minimum.out", "eq": "eq.Tensor_out", "lt": "lt.Tensor_out",
}
aten = torch.ops.aten

CASES: tuple[Case, ...] = (
    # Elementwise, unary and binary.
    *(Case(n, f"aten::{n}.out", one(positive if n in POSITIVE else vec), getattr(torch, n)) for n in UNARY),
    *(Case(n, f"aten::{o}", two(vec), getattr(torch, n)) for n, o in BINARY.items()),
    Case("pow", "aten::pow.Tensor_Tensor_out", two(positive, vec), torch.pow),
    Case("logical_and", "aten::logical_and.out", two(mask), torch.logical_and),
    Case("bitwise_and", "aten::bitwise_and.Tensor_out", two(int32s), torch.bitwise_and),
    Case("where", "aten::where.self_out", lambda large: (mask(large), vec(large), vec(large)), torch.where),
    # Operands of another dtype, cast to the common one: a Python number, an
    # integer tensor, a bool mask.
    Case("mul scalar", "aten::mul.out", one(vec), lambda a, **out: torch.mul(a, 0.5, **out)),
    Case("add int+float", "aten::add.out", two(vec, int32s), torch.add),
    Case("mul mask", "aten::mul.out", two(vec, mask), torch.mul),
    # Activations and their backward.
    Case("relu", "aten::relu", one(vec), torch.relu, large="alloc"),
    Case("gelu", "aten::gelu.out", one(vec), F.gelu, out=aten_out(aten.gelu.out)),
    Case("silu", "aten::silu.out", one(vec), F.silu, out=aten_out(aten.silu.out)),
    Case("leaky_relu", "aten::leaky_relu.out", one(vec), F.leaky_relu, out=aten_out(aten.leaky_relu.out, 0.01)),
    Case("hardtanh", "aten::hardtanh.out", one(vec), F.hardtanh, out=aten_out(aten.hardtanh.out, -1.0, 1.0)),
    Case("dropout", "aten::native_dropout", one(vec), lambda a: F.dropout(a, 0.5), large="alloc", calls=1),
    Case("gelu_backward", "aten::gelu_backward.grad_input", two(vec), aten.gelu_backward,
         out=aten_out(aten.gelu_backward.grad_input, out_name="grad_input")),
    Case("silu_backward", "aten::silu_backward.grad_input", two(vec), aten.silu_backward,
         out=aten_out(aten.silu_backward.grad_input, out_name="grad_input")),
    # Filling and copying on the device (clone allocates; copy_ is the d2d copy below).
    Case("fill_", "aten::fill_.Scalar", one(vec), lambda a: a.fill_(1.5), large="in-place"),
    Case("zero_", "aten::zero_", one(vec), lambda a: a.zero_(), large="in-place"),
    Case("clone", "aten::_copy_from", one(vec), torch.clone, large="alloc"),
    # Reductions: the output is small, so the functional call on large inputs too.
    Case("sum", "aten::sum.dim_IntList", one(vec), torch.sum, large="fn"),
    Case("mean", "aten::mean.out", one(vec), torch.mean, large="fn"),
    Case("prod", "aten::prod", lambda large: (1 + 1e-3 * vec(large),), torch.prod, large="fn"),
    Case("amax", "aten::amax.out", one(mat), lambda m: torch.amax(m, 1), large="fn"),
    Case("max(dim)", "aten::max.dim_max", one(mat), lambda m: torch.max(m, 1), large="fn"),
    Case("argmax", "aten::argmax.out", one(vec), torch.argmax, large="fn"),
    Case("std", "aten::std.correction", one(vec), torch.std, large="fn"),
    Case("var", "aten::var.correction", one(vec), torch.var, large="fn"),
    Case("norm", "aten::linalg_vector_norm.out", one(vec), torch.linalg.vector_norm, large="fn"),
    # any of all-False and all of all-True read every element.
    Case("any", "aten::any", lambda large: (torch.zeros(N[large], dtype=torch.bool),), torch.any, large="fn"),
    Case("all", "aten::all", lambda large: (torch.ones(N[large], dtype=torch.bool),), torch.all, large="fn"),
    # Matrix products: 4x4 and 2048x2048 matrices, batches of 1x4x4 and 64x512x512.
    Case("mm", "aten::mm.out", mm_inputs(MM, bias=False), torch.mm, calls=1),
    Case("addmm", "aten::addmm.out", mm_inputs(MM, bias=True), torch.addmm, calls=1),
    Case("bmm", "aten::bmm.out", mm_inputs(BMM, bias=False), torch.bmm, calls=1),
    Case("baddbmm", "aten::baddbmm.out", mm_inputs(BMM, bias=True), torch.baddbmm, calls=1),
    # linear on a 2-D input with bias is addmm(bias, input, weight.t()).
    Case("linear", "aten::addmm.out", linear_inputs, F.linear, large="alloc", calls=1),
    # Joining and indexing.
    Case("cat", "aten::cat.out", two(half), lambda a, b, **out: torch.cat((a, b), **out)),
    Case("stack", "aten::cat.out", two(half), lambda a, b, **out: torch.stack((a, b), **out)),
    Case("index_select", "aten::index_select.out",
         lambda large: (mat(large), torch.randperm(M[large][0])),
         lambda m, i, **out: torch.index_select(m, 0, i, **out)),
    Case("gather", "aten::gather.out", rows_index, lambda m, i, **out: torch.gather(m, 1, i, **out)),
    Case("scatter", "aten::scatter.src_out", lambda large: (*rows_index(large), mat(large)),
         lambda m, i, s, **out: torch.scatter(m, 1, i, s, **out)),
    Case("index", "aten::index.Tensor_out", vector_index, lambda a, i: a[i],
         out=lambda a, i, out: aten.index.Tensor_out(a, [i], out=out), calls=1),
    Case("index_put_", "aten::_index_put_impl_", lambda large: (*vector_index(large), vec(large)),
         lambda a, i, v: a.index_put_((i,), v), large="in-place", calls=1),
    Case("masked_fill_", "aten::masked_fill_.Scalar", two(vec, mask), lambda a, m: a.masked_fill_(m, 0.0),
         large="in-place"),
    Case("masked_select", "aten::masked_select.out", two(vec, mask), torch.masked_select, calls=1),
    # Sorting, scans, ranges.
    Case("sort", "aten::sort.values_stable", one(mat), lambda m, **out: torch.sort(m, -1, **out), calls=1),
    Case("topk", "aten::topk.values", one(vec), lambda a, **out: torch.topk(a, 8, **out), calls=1),
    Case("cumsum", "aten::cumsum.out", one(vec), lambda a, **out: torch.cumsum(a, 0, **out)),
    Case("arange", "aten::arange.start_out", lambda large: (N[large], DEVICE),
         lambda n, d: torch.arange(n, device=d), out=lambda n, d, out: torch.arange(n, out=out)),
    Case("linspace", "aten::linspace.out", lambda large: (N[large], DEVICE),
         lambda n, d: torch.linspace(0, 1, n, device=d), out=lambda n, d, out: torch.linspace(0, 1, n, out=out)),
    # Softmax over the rows of a matrix, and its backward.
    Case("softmax", "aten::_softmax.out", one(mat), lambda m: torch.softmax(m, -1),
         out=aten_out(aten._softmax.out, -1, False)),
    Case("log_softmax", "aten::_log_softmax.out", one(mat), lambda m: torch.log_softmax(m, -1),
         out=aten_out(aten._log_softmax.out, -1, False)),
    Case("softmax_backward", "aten::_softmax_backward_data.out", softmax_backward_inputs(log=False),
         lambda g, y: aten._softmax_backward_data(g, y, -1, torch.float32),
         out=aten_out(aten._softmax_backward_data.out, -1, torch.float32, out_name="grad_input")),
    Case("log_softmax_backward", "aten::_log_softmax_backward_data.out", softmax_backward_inputs(log=True),
         lambda g, y: aten._log_softmax_backward_data(g, y, -1, torch.float32),
         out=aten_out(aten._log_softmax_backward_data.out, -1, torch.float32)),
    # embedding is weight.index_select(0, indices) (a CompositeExplicitAutograd kernel).
    Case("embedding", "aten::index_select", embedding_inputs, lambda w, i: F.embedding(i, w), large="alloc"),
    # Random numbers: each device draws from its own generator.
    Case("uniform_", "aten::uniform_", one(vec), lambda a: a.uniform_(), large="in-place"),
    Case("normal_", "aten::normal_", one(vec), lambda a: a.normal_(), large="in-place"),
    Case("bernoulli_", "aten::bernoulli_.float", one(vec), lambda a: a.bernoulli_(0.5), large="in-place", calls=1),
    Case("random_", "aten::random_", one(vec), lambda a: a.random_(), large="in-place"),
    Case("randperm", "aten::randperm.generator_out", lambda large: (N[large], DEVICE),
         lambda n, d: torch.randperm(n, device=d), out=lambda n, d, out: torch.randperm(n, out=out), calls=1),
    # Convolution and pooling: 1x1x4x4 and 16x64x128x128 inputs, 3x3 filters (64 in, 64 out).
    Case("conv2d", "aten::convolution", lambda large: (torch.randn(IMAGE[large]), torch.randn(FILTER[large])),
         lambda x, w: F.conv2d(x, w, padding=1), large="alloc", calls=1),
    Case("max_pool2d", "aten::max_pool2d_with_indices.out", lambda large: (torch.randn(IMAGE[large]),),
         lambda x: F.max_pool2d(x, 2), large="alloc", calls=1),
    Case("avg_pool2d", "aten::avg_pool2d.out", lambda large: (torch.randn(IMAGE[large]),),
         lambda x: F.avg_pool2d(x, 2), out=aten_out(aten.avg_pool2d.out, [2, 2])),
    # Operators still on the CPU fallback (no binding in backend_functions.yaml).
    Case("nan_to_num", "aten::nan_to_num.out", one(vec), torch.nan_to_num,
         out=aten_out(aten.nan_to_num.out, None, None, None)),
    Case("logcumsumexp", "aten::_logcumsumexp", one(vec), lambda a, **out: torch.logcumsumexp(a, 0, **out)),
    Case("kthvalue", "aten::kthvalue.values", one(vec), lambda a, **out: torch.kthvalue(a, 3, **out), calls=1),
    Case("isnan", "aten::isnan", one(vec), torch.isnan, large="alloc"),
    # Copies: CPU's copy_ between two CPU tensors against the same copy_ to, from, within openreg.
    *(Case(f"copy {kind}", "aten::_copy_from", lambda large: (vec(large), torch.empty(N[large])),
           lambda src, dst: dst.copy_(src), large="in-place", copy=kind) for kind in COPY_KINDS),
)

GOALS = {  # group: (largest ratio that meets the goal, the goal in words)
    "native small": (1.10, "<=1.10x"),
    "native large": (1.05, "<=1.05x"),
    "fallback small": (2.0, "<=2.0x"),
    "fallback large": (1.3, "<=1.3x"),
    "copies": (1 / 0.9, ">=0.9x GB/s"),
}


def place(case: Case, args: tuple, device: str) -> tuple:
    """The case's arguments on device: tensors moved (for a copy, only the ones
    that live on openreg), DEVICE replaced by the device's name."""
    on_device = COPY_KINDS[case.copy] if case.copy and device != "cpu" else (True,) * len(args)
    return tuple(
        device if a is DEVICE else a.to(device) if isinstance(a, torch.Tensor) and moved else a
        for a, moved in zip(args, on_device)
    )


def empty_like(result: Any, device: str) -> Any:
    if isinstance(result, torch.Tensor):
        return torch.empty_like(result, device=device)
    return tuple(empty_like(r, device) for r in result)


def bound_call(case: Case, large: bool, args: tuple, out: Any) -> Callable[[], object]:
    if case.call(large) != "out=":
        return lambda: case.fn(*args)
    if case.out is not None:
        return lambda: case.out(*args, out=out)
    return lambda: case.fn(*args, out=out)


def per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.openreg.synchronize()
    return (time.perf_counter() - start) / calls


def calls_per_batch(cpu: Callable[[], Any], batch_ms: float) -> int:
    """From the fastest of three CPU calls (the first ones after a compile or
    an allocator's growth can be many times slower)."""
    fastest = min(per_call(cpu, 1) for _ in range(3))
    return max(1, round(batch_ms / 1e3 / fastest))


def describe(args: tuple, result: Any) -> str:
    """The shape of the first tensor argument (of the result for factories): 16M, 4096x4096."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None:
        first = result if isinstance(result, torch.Tensor) else result[0]
    return "x".join(f"{d >> 20}M" if d >= 1 << 20 and d % (1 << 20) == 0 else str(d) for d in first.shape)


def pair_ratios(cpu_t: list[float], dev_t: list[float]) -> list[float]:
    """openreg's time over CPU's, batch pair by batch pair. The machine's speed
    drifts between batches (a neighbour's load on a shared host moves CPU's own
    time per call by up to 2x between runs); within a pair both devices ran in
    the same conditions, so the median of the pairs' ratios is steadier than
    the ratio of the two medians."""
    return [d / c for c, d in zip(cpu_t, dev_t)]


def alternating_pairs(
    cpu: Callable[[int], float], dev: Callable[[int], float], repeat: int
) -> tuple[list[float], list[float]]:
    """``repeat`` pairs of adjacent batches, ``cpu(i)`` and ``dev(i)`` timing pair i's
    batch on each device (seconds per call), in alternating order (CPU first, then
    openreg first), so that neither device always runs in the other's wake (warm caches,
    a neighbour's load that comes and goes). The times of each, in pair order."""
    cpu_t, dev_t = [], []
    for i in range(repeat):
        if i % 2 == 0:
            cpu_t.append(cpu(i))
            dev_t.append(dev(i))
        else:
            dev_t.append(dev(i))
            cpu_t.append(cpu(i))
    return cpu_t, dev_t


def quartiles(values: list[float]) -> tuple[float, float]:
    """The first and third quartile: the ratio's spread between pairs."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def median_interval(values: list[float]) -> tuple[float, float]:
    """A confidence interval of at least 95% for the median, assuming no
    distribution (the sign test's): with e values left out on each side, the
    true median lies below the lowest one kept only if at most e of the values
    are below it, which has probability P(Binomial(n, 1/2) <= e). The quartiles
    say how much single pairs differ; this says how far the median could still
    move in a longer run. Up to 8 values: their whole range (less than 95%)."""
    ordered = sorted(values)
    n = len(ordered)
    e, tail = 0, 1 / 2**n  # tail: P(Binomial(n, 1/2) <= e)
    while (wider := tail + math.comb(n, e + 1) / 2**n) <= 0.025:
        e, tail = e + 1, wider
    return ordered[e], ordered[n - 1 - e]


def measure(case: Case, large: bool, repeat: int, calls: int, placements: int) -> dict[str, Any]:
    """Times the case on both devices, interleaved; one row of the table."""
    # Each placement is a fresh set of arguments (and out= tensors) on both
    # devices, all alive at once so that no allocator hands the same memory
    # back; pair i runs on placement i % placements. Where a large tensor lands
    # (its pages' cache sets, its address relative to the other operands')
    # moved one operator's time by up to 10% between allocations while a
    # placement's own pairs agreed within 3%.
    sets = []
    for _ in range(placements):
        torch.manual_seed(0)
        args = case.inputs(large)
        cpu_args, dev_args = place(case, args, "cpu"), place(case, args, DEV)
        result = case.fn(*cpu_args)
        cpu_out = dev_out = None
        if case.call(large) == "out=":
            cpu_out, dev_out = empty_like(result, "cpu"), empty_like(result, DEV)
        cpu, dev = bound_call(case, large, cpu_args, cpu_out), bound_call(case, large, dev_args, dev_out)
        cpu()
        dev()
        sets.append((cpu, dev))
    torch.openreg.synchronize()
    # Which operators the openreg call ran on the CPU fallback: checks the label.
    diagnostics.reset_fallback_stats()
    sets[0][1]()
    torch.openreg.synchronize()
    fallback_ops = sorted(diagnostics.fallback_stats())
    cpu_t, dev_t = alternating_pairs(lambda i: per_call(sets[i % placements][0], calls),
                                     lambda i: per_call(sets[i % placements][1], calls), repeat)
    cpu_s, dev_s = statistics.median(cpu_t), statistics.median(dev_t)
    ratios = pair_ratios(cpu_t, dev_t)
    row = {"op": case.name, "aten": case.op, "size": "large" if large else "small",
           "shape": describe(cpu_args, result), "call": case.call(large), "calls": calls,
           "cpu_us": cpu_s * 1e6, "openreg_us": dev_s * 1e6, "ratio": statistics.median(ratios),
           "ratio_quartiles": quartiles(ratios), "fallback_ops": fallback_ops}
    if case.copy:
        nbytes = args[0].nbytes
        row |= {"cpu_GBps": nbytes / cpu_s / 1e9, "openreg_GBps": nbytes / dev_s / 1e9}
    return row


def group(row: dict[str, Any]) -> str:
    return "copies" if "cpu_GBps" in row else f"{row['label']} {row['size']}"


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per group (native small, ..., copies): median and worst ratio, cases meeting the goal."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(group(r), []).append(r)
    order = list(GOALS) + sorted(set(groups) - set(GOALS))
    summary = []
    for name in (g for g in order if g in groups):
        members = groups[name]
        worst = max(members, key=lambda r: r["ratio"])
        limit, words = GOALS.get(name, (None, "-"))
        summary.append({
            "group": name, "cases": len(members),
            "median_ratio": statistics.median(r["ratio"] for r in members),
            "max_ratio": worst["ratio"], "max_op": worst["op"], "goal": words,
            "meeting_goal": None if limit is None else sum(r["ratio"] <= limit for r in members),
        })
    return summary


def route_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per route and size: the cases' median and worst ratio. Run with
    OPENREG_DISCRETE_MEMORY=1 and without, it shows what staging costs each
    route (docs/porting.md)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if "cpu_GBps" not in r:
            groups.setdefault((r["route"], r["size"]), []).append(r["ratio"])
    return [{"route": route, "size": size, "cases": len(ratios), "median_ratio": statistics.median(ratios),
             "max_ratio": max(ratios)} for (route, size), ratios in sorted(groups.items())]


def label_notes(row: dict[str, Any]) -> list[str]:
    """Where what the openreg call ran on the fallback disagrees with the label."""
    reached = row["fallback_ops"]
    base = row["aten"].split(".")[0]
    if row["label"] == "native" and reached:
        return [f"{row['op']} ({row['size']}): labelled native, but ran {', '.join(reached)} on the fallback"]
    if row["label"] == "fallback" and not any(op.split(".")[0] == base for op in reached):
        return [f"{row['op']} ({row['size']}): labelled fallback by {row['aten']}, "
                f"but the fallback ran {', '.join(reached) or 'nothing'}; the table's operator may be stale"]
    return []


ROW = "{:<34} {:<5} {:<14} {:<8} {:>11} {:>11} {:>6} {:<9}{}"


def print_row(r: dict[str, Any]) -> None:
    name = r["op"] if "cpu_GBps" in r else f"{r['op']} ({r['label']})"
    bandwidth = f"  {r['cpu_GBps']:.2f} / {r['openreg_GBps']:.2f}" if "cpu_GBps" in r else ""
    q1, q3 = r["ratio_quartiles"]
    print(ROW.format(name, r["size"], r["shape"], r["call"], f"{r['cpu_us']:.2f}", f"{r['openreg_us']:.2f}",
                     f"{r['ratio']:.2f}", f"{q1:.2f}-{q3:.2f}", bandwidth), flush=True)


def print_summary(summary: list[dict[str, Any]]) -> None:
    print(f"\n{'group':<16} {'cases':>5} {'median':>7} {'max':>6}  {'(op)':<22} {'goal':<12} meeting")
    for s in summary:
        meeting = "-" if s["meeting_goal"] is None else f"{s['meeting_goal']}/{s['cases']}"
        print(f"{s['group']:<16} {s['cases']:>5} {s['median_ratio']:>7.2f} {s['max_ratio']:>6.2f}  "
              f"{'(' + s['max_op'] + ')':<22} {s['goal']:<12} {meeting}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the rows and the summary to FILE")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed pairs of batches (one batch per device); the median is kept "
                             f"(default {REPEAT['small']} small, {REPEAT['large']} large)")
    parser.add_argument("--placements", type=int, default=3,
                        help="fresh sets of arguments per case, alive together; the pairs take turns on them")
    parser.add_argument("--size", choices=("small", "large", "both"), default="both")
    parser.add_argument("--only", metavar="SUBSTR", help="comma list: run the cases whose name contains one of them")
    parser.add_argument("--calls-scale", type=float, default=1.0, metavar="F",
                        help=f"multiply the calls per batch ({SMALL_CALLS} small, 1-3 large), e.g. 0.01 for a smoke test")
    parser.add_argument("--sanitizer", action="store_true",
                        help="run under torch.openreg.sanitizer (as TORCH_OPENREG_SANITIZER=1): its cost is "
                             "the openreg column against a run without")
    parser.add_argument("--record-memory-history", action="store_true",
                        help="record openreg's allocation history with Python stacks "
                             "(torch.openreg.memory._record_memory_history(stacks='python')): its cost is the "
                             "openreg column against a run without")
    args = parser.parse_args(argv)
    if (args.repeat is not None and args.repeat < 1) or args.placements < 1 or args.calls_scale <= 0:
        parser.error("--repeat and --placements must be at least 1, --calls-scale positive")
    wanted = [s.strip() for s in args.only.split(",")] if args.only else None
    cases = [c for c in CASES if wanted is None or any(w in c.name for w in wanted)]
    if not cases:
        parser.error(f"--only {args.only}: no case matches; the cases are {', '.join(c.name for c in CASES)}")
    sizes = {"small": (False,), "large": (True,), "both": (False, True)}[args.size]

    if args.sanitizer:
        torch.openreg.sanitizer.enable()
    if args.record_memory_history:
        torch.openreg.memory._record_memory_history(stacks="python", max_entries=100_000)
    bound = info.bindings()
    labels = {c.name: info.classify(c.op, bound).category for c in cases}
    routes = {c.name: bound[c.op][0].name if c.op in bound else labels[c.name] for c in cases}
    discrete = os.environ.get("OPENREG_DISCRETE_MEMORY") == "1"
    repeat = {size: args.repeat or REPEAT[size] for size in REPEAT}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"repeat {repeat['small']} small / {repeat['large']} large, "
          f"placements {args.placements}, calls x{args.calls_scale:g}"
          f"{', sanitizer on' if torch.openreg.sanitizer.is_enabled() else ''}"
          f"{', memory history recorded' if args.record_memory_history else ''}"
          f"{', discrete memory (OPENREG_DISCRETE_MEMORY=1)' if discrete else ''}; ratio = openreg / CPU")
    print(ROW.format("op (label)", "size", "shape", "call", "cpu us", "openreg us", "ratio", "q1-q3",
                     "  GB/s cpu / openreg"))
    rows = []
    for large in sizes:
        for case in cases:
            calls = max(1, round((case.calls if large else SMALL_CALLS) * args.calls_scale))
            row = measure(case, large, repeat["large" if large else "small"], calls, args.placements)
            row["label"], row["route"] = labels[case.name], routes[case.name]
            rows.append(row)
            print_row(row)
    summary = summarize(rows)
    print_summary(summary)
    by_route = route_summary(rows)
    print(f"\n{'route':<28} {'size':<6} {'cases':>5} {'median':>7} {'max':>6}")
    for s in by_route:
        print(f"{s['route']:<28} {s['size']:<6} {s['cases']:>5} {s['median_ratio']:>7.2f} {s['max_ratio']:>6.2f}")
    notes = [n for r in rows if "cpu_GBps" not in r for n in label_notes(r)]
    for n in notes:
        print("note:", n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "repeat": repeat,
                       "placements": args.placements,
                       "calls_scale": args.calls_scale, "discrete_memory": discrete, "rows": rows,
                       "summary": summary, "routes": by_route, "notes": notes},
                      f, indent=1)
    bad = [r["op"] for r in rows if not (math.isfinite(r["ratio"]) and r["ratio"] > 0)]
    if bad:
        print("error: no usable time for", ", ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
