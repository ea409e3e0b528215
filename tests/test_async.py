"""Kernels launched on a stream: the launch returns at once, the work runs on the
stream's worker in stream order, and the calls that need results wait for it,
as on CUDA (docs/integration/streams.md, "Kernels")."""

import gc
import inspect
import json
import os
import resource
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from test_generators import as_cpu_state

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

DEVICE = "openreg"
BUSY_MS = 300

# The suite also runs with OPENREG_LAUNCH_BLOCKING=1 (every launch waits for its
# kernel, whose error raises at the call) and with OPENREG_QUEUE_ALL_KERNELS=1
# (small kernels on an idle stream are queued too); the tests below check what
# each mode promises.
BLOCKING = os.environ.get("OPENREG_LAUNCH_BLOCKING", "0") == "1"
SMALL_RUNS_AT_ONCE = BLOCKING or os.environ.get("OPENREG_QUEUE_ALL_KERNELS", "0") == "0"
QUEUED = 0 if BLOCKING else 1  # what a launch that is not run at once adds to the queue


def busy(ms=BUSY_MS):
    """Keeps the current stream busy for `ms` (torch.openreg._sleep)."""
    torch.openreg.synchronize()
    torch.openreg._sleep(ms)


def launched_before(fn):
    """Runs fn behind queued work: the first launch of a kernel with a
    combination of operand dtypes runs in the calling thread, so that CPU's "not
    implemented for" errors raise at the call, and so does the first call of a
    CPU kernel with given operand shapes that could be queued, which learns its
    results' shapes (docs/integration/streams.md, "Kernels"); later ones are queued. Twice:
    a first call may take longer than the queued work (lazy initialisation)."""
    for _ in range(2):
        busy(30)
        fn()
        torch.openreg.synchronize()


def elapsed(fn):
    start = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - start) * 1e3


def assert_waited(launch_ms, sync_ms):
    """The work queued before took BUSY_MS: synchronising waited for it, or, with
    OPENREG_LAUNCH_BLOCKING=1, the launch did."""
    waited, returned_at_once = (launch_ms, sync_ms) if BLOCKING else (sync_ms, launch_ms)
    assert returned_at_once < BUSY_MS / 2, f"returned after {returned_at_once:.0f} ms (blocking: {BLOCKING})"
    assert waited > BUSY_MS / 4, f"returned after {waited:.0f} ms, before the queued work ran (blocking: {BLOCKING})"


def test_a_kernel_launch_returns_before_the_kernel_runs():
    x = torch.randn(64, 64, device=DEVICE)
    launched_before(lambda: x + 1)
    busy()
    y, launch_ms = elapsed(lambda: x + 1)
    assert torch.openreg.current_stream().query() is BLOCKING
    _, sync_ms = elapsed(torch.openreg.synchronize)
    assert_waited(launch_ms, sync_ms)
    torch.testing.assert_close(y.cpu(), x.cpu() + 1, rtol=0, atol=0)



def queued(stream=None):
    """Tasks queued on `stream` (the current one) so far."""
    stream = stream or torch.openreg.current_stream()
    return torch.openreg._C._stream_queued_count(stream.stream_id, stream.device_index)


def test_a_small_kernel_on_an_idle_stream_runs_at_once_and_a_large_or_busy_one_is_queued():
    small = torch.ones(16, device=DEVICE)
    large = torch.ones(1 << 16, device=DEVICE)
    launched_before(lambda: (small + 1, large + 1))
    count = queued()
    y = small + 1  # idle stream, 16 elements: run at once, nothing queued
    assert queued() == count + (0 if SMALL_RUNS_AT_ONCE else 1)
    count = queued()
    z = large + 1  # 65536 elements: queued
    assert queued() == count + QUEUED
    busy(50)  # the sleep is queued too
    count = queued()
    w = small + 2  # behind queued work: queued
    assert queued() == count + QUEUED
    assert torch.equal(y.cpu(), torch.full((16,), 2.0))
    assert torch.equal(z.cpu(), torch.full((1 << 16,), 2.0))
    assert torch.equal(w.cpu(), torch.full((16,), 3.0))


def launch_failing_kernel(fn, at_once=False):
    """Launches fn, whose kernel fails. A kernel run in the calling thread (a
    small one on an idle stream, `at_once`; every kernel with
    OPENREG_LAUNCH_BLOCKING=1) raises CPU's error here, and there is nothing
    left to report (False); a queued kernel's error is the stream's, reported
    at the next synchronising call (True)."""
    if at_once or BLOCKING:
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn()
        return False
    fn()
    return True


def test_a_small_kernel_run_at_once_raises_its_error_at_the_call():
    a = torch.tensor([5, 6], device=DEVICE)
    zero = torch.zeros_like(a)
    launched_before(lambda: torch.div(a, a, rounding_mode="floor"))
    torch.openreg.synchronize()
    count = queued()
    deferred = launch_failing_kernel(lambda: torch.div(a, zero, rounding_mode="floor"), at_once=SMALL_RUNS_AT_ONCE)
    assert queued() == count + (0 if SMALL_RUNS_AT_ONCE else 1)
    if deferred:
        with pytest.raises(torch.AcceleratorError, match="div_floor_stub: ZeroDivisionError"):
            torch.openreg.synchronize()
    torch.openreg.synchronize()  # reported once


def test_queue_all_kernels_queues_a_small_kernel_on_an_idle_stream_too():
    result = run_script(
        """
        import torch
        s = torch.openreg.current_stream()
        queued = lambda: torch.openreg._C._stream_queued_count(s.stream_id, s.device_index)
        x = torch.ones(16, device="openreg")
        x + 1  # the first launch of a dtype combination runs in the calling thread
        torch.openreg.synchronize()
        count = queued()
        y = x + 1
        print("queued", queued() - count, y.cpu().tolist() == [2.0] * 16)
        """,
        OPENREG_QUEUE_ALL_KERNELS="1",
        OPENREG_LAUNCH_BLOCKING="0",
    )
    assert result.returncode == 0, result.stderr
    assert "queued 1 True" in result.stdout


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x, i: torch.softmax(x, 1), id="structured_on_cpu_aliases"),
        pytest.param(lambda x, i: torch.nn.functional.gelu(x), id="structured_on_cpu_aliases_iterator"),
        pytest.param(lambda x, i: torch.cumsum(x, 1, out=x), id="structured_on_cpu_aliases_out_is_self"),
        pytest.param(lambda x, i: x @ x, id="mm_blas"),
        pytest.param(lambda x, i: x.to(torch.int64) @ x.to(torch.int64), id="mm_cpu_kernel"),
        pytest.param(lambda x, i: x.view(64, 8, 8) @ x.view(64, 8, 8), id="bmm"),
        pytest.param(lambda x, i: x.gather(1, i), id="gather"),
        pytest.param(lambda x, i: x.scatter(1, i, 2.0), id="scatter"),
        pytest.param(lambda x, i: x.index_select(0, i[0]), id="index_select"),
        pytest.param(lambda x, i: torch.index_select(x, 0, i[0], out=x.new_empty(0)), id="index_select_out_resized"),
        pytest.param(lambda x, i: x.max(1), id="max_dim"),
        # CPU's kernel through the boxed launch
        # (docs/integration/streams.md, "CPU kernels and the fallback").
        pytest.param(lambda x, i: torch.nn.functional.layer_norm(x, (64,)), id="cpu_kernel"),
        pytest.param(lambda x, i: torch.std_mean(x, 1), id="cpu_kernel_two_results"),
        pytest.param(lambda x, i: x.index_fill_(1, i[0, :4], 2.0), id="cpu_kernel_in_place"),
        pytest.param(lambda x, i: torch.nn.functional.conv2d(x.view(1, 1, 64, 64), x[:3, :3].reshape(1, 1, 3, 3)),
                     id="cpu_kernel_conv"),
        pytest.param(lambda x, i: torch.nn.functional.scaled_dot_product_attention(
            x.view(1, 4, 16, 64), x.view(1, 4, 16, 64) * 0.5, x.view(1, 4, 16, 64), is_causal=True),
            id="fused_attention"),
        pytest.param(lambda x, i: x.index_put_((i[:, 0],), x * 2, accumulate=True), id="index_put_accumulate"),
        # The custom operator launches its loop (csrc/kernels/AddRelu.cpp); relu(x + x) on CPU.
        pytest.param(lambda x, i: torch.relu(x + x) if x.is_cpu else torch.ops.openreg.add_relu(x, x),
                     id="custom_op"),
        pytest.param(lambda x, i: torch.logcumsumexp(x, 1), id="fallback"),
        pytest.param(lambda x, i: torch.kthvalue(x, 3, 1), id="fallback_two_results"),
        pytest.param(lambda x, i: torch.nan_to_num(x, out=x), id="fallback_out"),
    ],
)
def test_every_launching_route_queues_behind_queued_work(fn):
    # Each route launches its kernel: behind a busy stream the call returns
    # at once, the kernel runs in stream order and computes what CPU does.
    x = torch.randn(64, 64).round()
    i = torch.randint(0, 64, (64, 64))
    expected = fn(x.clone(), i)
    dx, di = x.to(DEVICE), i.to(DEVICE)
    launched_before(lambda: fn(dx.clone(), di))
    dx = dx.clone()
    torch.openreg.synchronize()
    busy()
    count = queued()
    out, launch_ms = elapsed(lambda: fn(dx, di))
    assert (queued() > count) is not BLOCKING
    _, sync_ms = elapsed(torch.openreg.synchronize)
    assert_waited(launch_ms, sync_ms)
    torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), tuple(out) if isinstance(out, tuple) else out), expected)


def test_fused_attention_backward_queues_behind_queued_work():
    # The autograd thread launches the backward kernels; backward() returns
    # once they are queued.
    qkv = [torch.randn(1, 4, 16, 64, requires_grad=True) for _ in range(3)]
    placed = [t.detach().to(DEVICE).requires_grad_() for t in qkv]

    def step(q, k, v):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    step(*qkv)
    launched_before(lambda: step(*placed))
    for t in placed:
        t.grad = None
    busy()
    count = queued()
    _, launch_ms = elapsed(lambda: step(*placed))
    assert (queued() > count) is not BLOCKING
    _, sync_ms = elapsed(torch.openreg.synchronize)
    assert_waited(launch_ms, sync_ms)
    for got, expected in zip(placed, qkv):
        torch.testing.assert_close(got.grad.cpu(), expected.grad, rtol=0, atol=0)


# Each draws into `t` (64 x 64 floats, or int64 for randperm) from the device's
# default generator; the same call on CPU draws CPU's numbers for the same seed.
RANDOM_DRAWS = {
    "uniform_": lambda t: t.uniform_(),
    "uniform_range": lambda t: t.uniform_(-2.0, 3.0),  # torch's implementation on a CPU tensor
    "normal_": lambda t: t.normal_(1.0, 2.0),
    "normal_strided": lambda t: t[:, ::2].normal_(),
    "bernoulli_": lambda t: t.bernoulli_(0.3),
    "random_": lambda t: t.random_(0, 100),
    "exponential_": lambda t: t.exponential_(2.0),
    "cauchy_": lambda t: t.cauchy_(),
    "log_normal_": lambda t: t.log_normal_(),
    "geometric_": lambda t: t.geometric_(0.3),
    "randperm": lambda t: torch.randperm(t.numel(), out=t.view(-1)),
}


@pytest.mark.parametrize("name", list(RANDOM_DRAWS))
def test_a_random_draw_behind_queued_work_returns_at_once_with_the_generator_advanced(name):
    # The numbers are drawn at the call, from the host generator's state, so
    # that get_rng_state() and the next draw see it advanced at once (as
    # CUDA's launch reserves its Philox offset); they reach the tensor in
    # stream order, after the work queued before.
    fn = RANDOM_DRAWS[name]
    dtype = torch.int64 if name == "randperm" else torch.float32
    cpu = torch.zeros(64, 64, dtype=dtype)
    t = torch.zeros(64, 64, dtype=dtype, device=DEVICE)
    generator = torch.openreg.default_generators[torch.openreg.current_device()]
    torch.manual_seed(7)
    generator.manual_seed(7)
    fn(cpu)
    expected_state = torch.get_rng_state()
    busy()
    count = queued()
    _, launch_ms = elapsed(lambda: fn(t))
    assert torch.equal(as_cpu_state(generator.get_state()), expected_state)  # advanced at the call
    assert (queued() > count) is not BLOCKING
    _, sync_ms = elapsed(torch.openreg.synchronize)
    assert_waited(launch_ms, sync_ms)
    assert torch.equal(t.cpu(), cpu)


# Draws whose distribution comes from device values: the CPU kernel draws when
# it runs, queued; the generator waits for it before the host uses its state.
# `p` is a (16, 16) tensor of probabilities in (0.1, 0.9); `g` a generator or None.
DRAWS_FROM_DEVICE_VALUES = {
    "bernoulli": lambda p, g: torch.bernoulli(p, generator=g),
    "bernoulli_tensor_": lambda p, g: torch.empty_like(p).bernoulli_(p, generator=g),
    "normal_tensor_mean": lambda p, g: torch.normal(p, 2.0, generator=g),
    "normal_tensor_std": lambda p, g: torch.normal(1.0, p, generator=g),
    "normal_tensors": lambda p, g: torch.normal(p, p, generator=g),
    "poisson": lambda p, g: torch.poisson(p, generator=g),
    "binomial": lambda p, g: torch.binomial(p * 0 + 10.0, p, generator=g),
    "multinomial": lambda p, g: torch.multinomial(p, 8, replacement=True, generator=g),
}
# The same, without a generator argument in Python: the device's default one.
DRAWS_FROM_DEVICE_VALUES_DEFAULT_GENERATOR = {
    "standard_gamma": lambda p, g: torch._standard_gamma(p),
    "sample_dirichlet": lambda p, g: torch._sample_dirichlet(p),
    "rrelu_training": lambda p, g: torch.nn.functional.rrelu(p - 0.5, training=True),
}
DRAW_CASES = [(name, False) for name in {**DRAWS_FROM_DEVICE_VALUES, **DRAWS_FROM_DEVICE_VALUES_DEFAULT_GENERATOR}]
DRAW_CASES += [(name, True) for name in DRAWS_FROM_DEVICE_VALUES]


@pytest.mark.parametrize(("name", "given"), DRAW_CASES, ids=[f"{n}-{'given' if g else 'default'}_generator" for n, g in DRAW_CASES])
def test_a_draw_from_device_values_is_queued_and_the_generator_waits_for_it(name, given):
    fn = {**DRAWS_FROM_DEVICE_VALUES, **DRAWS_FROM_DEVICE_VALUES_DEFAULT_GENERATOR}[name]
    p = torch.rand(16, 16) * 0.8 + 0.1
    p_device = p.to(DEVICE)
    generator = torch.Generator(device=DEVICE) if given else None
    cpu_generator = torch.Generator() if given else None
    launched_before(lambda: fn(p_device, generator))  # learns the results' shapes at once
    torch.manual_seed(5)  # CPU's and the openreg devices' default generators
    for g in (generator, cpu_generator):
        if g is not None:
            g.manual_seed(5)
    expected = fn(p, cpu_generator)
    expected_state = (cpu_generator or torch.default_generator).get_state()
    device_generator = generator or torch.openreg.default_generators[torch.openreg.current_device()]
    busy()
    out, launch_ms = elapsed(lambda: fn(p_device, generator))
    state, state_ms = elapsed(device_generator.get_state)  # waits for the queued draw
    assert_waited(launch_ms, state_ms)
    assert torch.equal(as_cpu_state(state), expected_state)
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)


def test_the_host_uses_of_a_generator_wait_for_its_queued_draws():
    # A reseed, a draw made at the call and a draw queued on another stream all
    # come after the queued draw, so the numbers are CPU's in call order.
    p = torch.rand(64, 64)
    p_device = p.to(DEVICE)
    launched_before(lambda: torch.bernoulli(p_device))
    torch.manual_seed(3)
    expected = [torch.bernoulli(p), torch.rand(64, 64), torch.bernoulli(p)]
    torch.manual_seed(4)
    expected_after_reseed = torch.bernoulli(p)

    torch.openreg.manual_seed(3)
    busy()
    first = torch.bernoulli(p_device)  # queued behind the busy stream
    drawn_at_call = torch.rand(64, 64, device=DEVICE)  # waits for `first` to draw
    other = torch.openreg.Stream()
    with torch.openreg.stream(other):
        torch.openreg._sleep(BUSY_MS)
        second = torch.bernoulli(p_device)
        torch.openreg.manual_seed(4)  # waits for `second` to draw
        reseeded = torch.bernoulli(p_device)
    torch.openreg.synchronize()
    for got, want in zip([first, drawn_at_call, second, reseeded], expected + [expected_after_reseed]):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_a_queued_draw_on_another_stream_waits_for_the_pending_one():
    # Two draws queued on two streams from one generator: the second waits on
    # its stream for the first, so each gets CPU's numbers in call order.
    p = torch.rand(256, 256)  # not small: queued on an idle stream too
    p_device = p.to(DEVICE)
    other = torch.openreg.Stream()
    for stream in (torch.openreg.current_stream(), other):
        with torch.openreg.stream(stream):
            launched_before(lambda: torch.bernoulli(p_device))
    torch.manual_seed(9)
    expected = [torch.bernoulli(p), torch.bernoulli(p)]
    torch.openreg.manual_seed(9)
    busy()
    first = torch.bernoulli(p_device)  # queued behind BUSY_MS of work
    with torch.openreg.stream(other):
        count = queued(other)
        second = torch.bernoulli(p_device)  # its stream is idle, but the draw must come second
        assert queued(other) - count >= 2 * QUEUED  # the wait, then the draw
        other.synchronize()
    torch.openreg.synchronize()
    torch.testing.assert_close(first.cpu(), expected[0], rtol=0, atol=0)
    torch.testing.assert_close(second.cpu(), expected[1], rtol=0, atol=0)


def test_a_random_draw_lands_after_the_queued_work_that_reads_the_tensor():
    # A kernel queued before the draw reads the old values; the draw
    # overwrites them only after it ran.
    t = torch.ones(1 << 16, device=DEVICE)
    launched_before(lambda: t * 2)
    busy()
    doubled = t * 2
    t.uniform_()
    assert torch.equal(doubled.cpu(), torch.full((1 << 16,), 2.0))
    assert bool(((t >= 0) & (t < 1)).all())


@pytest.fixture(params=["plain", "sanitizer", "flop_counter"])
def torchs_python_code(request):
    """Nothing, or what puts torch's and torch_openreg's Python frames between a
    user's line and its kernels' launch: the stream sanitizer's dispatch mode,
    or torch's FlopCounterMode."""
    if request.param == "plain":
        yield
        return
    if request.param == "flop_counter":
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False):
            yield
        return
    sanitizer = torch.openreg.sanitizer
    was_enabled = sanitizer.is_enabled()
    sanitizer.enable()
    try:
        yield
    finally:
        torch.openreg.synchronize()
        if not was_enabled:
            sanitizer.disable()


@pytest.mark.parametrize("behind_queued_work", [False, True], ids=["run_at_once", "queued"])
def test_a_kernel_error_names_the_line_that_launched_it(behind_queued_work, torchs_python_code):
    # A small kernel on an idle stream runs at once and raises at the call; a
    # kernel behind queued work is queued, and its failure, reported later,
    # names the line, also when torch's Python code is between the line and
    # the launch.
    a = torch.tensor([5, 6], device=DEVICE)
    zero = torch.zeros_like(a)
    launched_before(lambda: torch.div(a, a, rounding_mode="floor"))
    if behind_queued_work:
        busy(50)
    else:
        torch.openreg.synchronize()
    at_once = SMALL_RUNS_AT_ONCE and not behind_queued_work
    line = inspect.currentframe().f_lineno + 1
    if launch_failing_kernel(lambda: torch.div(a, zero, rounding_mode="floor"), at_once):
        with pytest.raises(torch.AcceleratorError) as raised:
            torch.openreg.synchronize()
        assert f"the kernel was launched from {__file__}:{line} in " in str(raised.value)


def test_a_cpu_kernel_learns_the_results_of_each_new_geometry_at_once():
    # The first call that could be queued with operands of new shapes runs in
    # the calling thread and learns its results' shapes; the next is queued.
    x = torch.randn(8, 16, device=DEVICE)
    launched_before(lambda: torch.flip(x, [0]))
    for other in (torch.randn(4, 16, device=DEVICE), x.t(), x):
        busy()
        count = queued()
        out, launch_ms = elapsed(lambda: torch.flip(other, [1]))  # new dims: a new key too
        assert queued() == count  # ran at once, in stream order
        assert launch_ms > BUSY_MS / 4
        torch.testing.assert_close(out.cpu(), torch.flip(other.cpu(), [1]), rtol=0, atol=0)
        busy()
        count = queued()
        out = torch.flip(other, [1])
        assert queued() == count + QUEUED
        torch.testing.assert_close(out.cpu(), torch.flip(other.cpu(), [1]), rtol=0, atol=0)


def test_an_operator_whose_results_shape_depends_on_values_runs_at_once():
    # torch tags nonzero dynamic_output_shape: it waits for the stream and
    # never learns a shape.
    x = torch.randn(64, device=DEVICE)
    for _ in range(2):
        busy()
        out, launch_ms = elapsed(lambda: torch.nonzero(x > 0))
        assert launch_ms > BUSY_MS / 4
        assert torch.equal(out.cpu(), torch.nonzero(x.cpu() > 0))


def test_an_untagged_value_dependent_shape_is_an_error_at_the_next_synchronising_call_then_runs_at_once():
    # torch does not tag _padded_dense_to_jagged_forward (total_L=None):
    # the queued call returns the shape its first call learnt, which is wrong
    # here. The kernel finds out and reports it; the key then runs at once.
    dense = torch.randn(2, 4, 3)
    first, other = (0, 2, 5), (0, 1, 2)
    placed = {offsets: (dense.to(DEVICE), torch.tensor(offsets, device=DEVICE)) for offsets in (first, other)}
    expected = torch.ops.aten._padded_dense_to_jagged_forward(dense, [torch.tensor(other)], None)

    def jagged(offsets):
        dense, offsets = placed[offsets]
        return torch.ops.aten._padded_dense_to_jagged_forward(dense, [offsets], None)

    launched_before(lambda: jagged(first))
    busy()
    out = jagged(other)  # the host copies above would wait for the stream
    if BLOCKING:
        torch.testing.assert_close(out.cpu(), expected)
    else:
        with pytest.raises(
            torch.AcceleratorError,
            match=r"(?s)_padded_dense_to_jagged_forward returned \[2, 3\] float where its first call .* returned "
            r"\[5, 3\] float: its result depends on the operands' values.*OPENREG_LAUNCH_BLOCKING=1",
        ):
            torch.openreg.synchronize()
    busy()
    torch.testing.assert_close(jagged(other).cpu(), expected)


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: torch.ops.quantized.embedding_bag_byte_prepack(x), id="cpp_meta_kernel"),
        pytest.param(lambda x: torch.ops.mkldnn._linear_pointwise(x, x[:32], x[0, :32], "none", [], ""),
                     id="python_meta_kernel"),
    ],
)
def test_another_librarys_cpp_operator_whose_meta_kernel_tells_the_shapes_is_queued(fn):
    # Outside aten, a C++ CPU kernel whose Meta kernel gives the results'
    # shapes from the operands' is queued like torch's own operators.
    x = torch.randn(64, 64)
    dx = x.to(DEVICE)
    launched_before(lambda: fn(dx))
    busy()
    count = queued()
    out, launch_ms = elapsed(lambda: fn(dx))
    assert (queued() > count) is not BLOCKING
    _, sync_ms = elapsed(torch.openreg.synchronize)
    assert_waited(launch_ms, sync_ms)
    torch.testing.assert_close(out.cpu(), fn(x), rtol=0, atol=0)


def fake_bf16_quantized(dynamic):
    """A fake (Meta) kernel for quantization::_FloatToBfloat16Quantized, a C++
    operator that has none: one that gives its result's shape, or one that
    asks for a dynamic size, as a value-dependent operator's does (torchvision's
    nms); registered until the Library is destroyed."""
    lib = torch.library.Library("quantization", "FRAGMENT")

    def fake(x):
        if dynamic:
            return x.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.float16)
        return x.new_empty(x.shape, dtype=torch.float16)

    torch.library.register_fake("quantization::_FloatToBfloat16Quantized", fake, lib=lib)
    return lib


# Each case with operands of its own shape: a key learns once whether it may be queued.
ROWS_BY_CASE = {"python_cpu_kernel": 8, "no_meta_kernel": 9, "dynamic_fake_kernel": 10, "static_fake_kernel": 11}


@pytest.mark.parametrize("case", ROWS_BY_CASE)
def test_another_librarys_operator_is_queued_only_with_a_cpp_kernel_and_a_meta_kernel_that_tells_the_shapes(case):
    # A Python CPU kernel would need the GIL on the stream's worker; without a
    # Meta kernel that gives the results' shapes, they may depend on the
    # values. Either runs at once, in stream order, every time.
    x = torch.randn(ROWS_BY_CASE[case], 64)
    libs = []
    try:
        if case == "python_cpu_kernel":
            lib = torch.library.Library("openreg_test_python_cpu", "DEF")
            libs.append(lib)
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x * 2, "CPU")
            torch.library.register_fake("openreg_test_python_cpu::twice", torch.empty_like, lib=lib)
            fn, expected = torch.ops.openreg_test_python_cpu.twice, x * 2
        else:
            if case != "no_meta_kernel":
                libs.append(fake_bf16_quantized(dynamic=case == "dynamic_fake_kernel"))
            fn = torch.ops.quantization._FloatToBfloat16Quantized
            expected = fn(x)
        dx = x.to(DEVICE)
        launched_before(lambda: fn(dx))
        busy()
        count = queued()
        out, launch_ms = elapsed(lambda: fn(dx))
        if case == "static_fake_kernel":
            assert (queued() > count) is not BLOCKING
        else:
            assert queued() == count
            assert launch_ms > BUSY_MS / 4
        torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
    finally:
        for lib in libs:
            lib._destroy()


def test_a_queued_cpu_kernel_reports_its_error_at_the_next_synchronising_call():
    logp = torch.randn(4, 5, device=DEVICE).log_softmax(1)
    good = torch.tensor([0, 1, 2, 3], device=DEVICE)
    bad = torch.tensor([2, 3, 4, 5], device=DEVICE)
    launched_before(lambda: torch.nn.functional.nll_loss(logp, good))
    busy()
    if BLOCKING:
        with pytest.raises(IndexError, match="Target 5 is out of bounds"):
            torch.nn.functional.nll_loss(logp, bad)
    else:
        torch.nn.functional.nll_loss(logp, bad)
        with pytest.raises(torch.AcceleratorError, match="aten::nll_loss_forward: Target 5 is out of bounds"):
            torch.openreg.synchronize()
    torch.testing.assert_close(
        torch.nn.functional.nll_loss(logp, good).cpu(), torch.nn.functional.nll_loss(logp.cpu(), good.cpu())
    )


def test_kernels_run_in_stream_order():
    x = torch.zeros(1000, device=DEVICE)
    busy(50)
    for _ in range(100):
        x.add_(1)
    y = x * 2
    assert torch.equal(y.cpu(), torch.full((1000,), 200.0))


@pytest.mark.parametrize(
    "sync",
    [
        pytest.param(lambda y: y.sum().item(), id="item"),
        pytest.param(lambda y: y.cpu(), id="cpu"),
        pytest.param(lambda y: y.to("cpu"), id="to_cpu"),
        pytest.param(lambda y: y.tolist(), id="tolist"),
        pytest.param(lambda y: repr(y), id="print"),
        pytest.param(lambda y: torch.nonzero(y), id="nonzero"),
        pytest.param(lambda y: y[y > 0], id="masked_select"),
        pytest.param(lambda y: torch.unique(y), id="unique"),
        pytest.param(lambda y: torch.openreg.current_stream().synchronize(), id="stream_synchronize"),
        pytest.param(lambda y: torch.openreg.synchronize(), id="synchronize"),
    ],
)
def test_what_needs_the_result_waits_for_it(sync):
    x = torch.arange(8, dtype=torch.float32, device=DEVICE)
    launched_before(lambda: x + 1)
    busy()
    y, launch_ms = elapsed(lambda: x + 1)
    _, sync_ms = elapsed(lambda: sync(y))
    assert_waited(launch_ms, sync_ms)
    assert torch.equal(y.cpu(), torch.arange(8, dtype=torch.float32) + 1)


def test_event_synchronize_waits_for_the_kernels_before_the_record():
    x = torch.randn(16, device=DEVICE)
    launched_before(x.exp)
    busy()
    y, launch_ms = elapsed(x.exp)
    event = torch.openreg.Event()
    event.record()
    assert event.query() is BLOCKING
    _, sync_ms = elapsed(event.synchronize)
    assert_waited(launch_ms, sync_ms)
    assert event.query() is True
    torch.testing.assert_close(y.cpu(), x.cpu().exp(), rtol=0, atol=0)


def test_elapsed_time_times_the_kernels_not_their_launch():
    x = torch.randn(16, device=DEVICE)
    start, end = torch.openreg.Event(enable_timing=True), torch.openreg.Event(enable_timing=True)
    torch.openreg.synchronize()
    start.record()
    torch.openreg._sleep(100)
    x.add_(1)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 90


def test_a_kernel_on_another_stream_is_ordered_by_wait_stream():
    x = torch.ones(1000, device=DEVICE)
    side = torch.openreg.Stream()
    busy()
    y = x * 3  # default stream, still queued
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        z = y + 1
    y.record_stream(side)
    side.synchronize()
    assert torch.equal(z.cpu(), torch.full((1000,), 4.0))


def test_argument_errors_still_raise_at_the_call():
    a, b = torch.randn(3, device=DEVICE), torch.randn(4, device=DEVICE)
    busy()
    with pytest.raises(RuntimeError, match="must match the size"):
        a + b
    torch.openreg.synchronize()


def test_a_kernel_error_surfaces_at_the_next_synchronising_call_and_the_device_stays_usable():
    a = torch.tensor([5, 6], device=DEVICE)
    zero = torch.zeros(2, dtype=torch.long, device=DEVICE)
    launched_before(lambda: torch.div(a, a, rounding_mode="floor"))
    busy(50)
    # CPU's kernel raises ZeroDivisionError, on the worker.
    out = []
    if launch_failing_kernel(lambda: out.append(torch.div(a, zero, rounding_mode="floor"))):
        with pytest.raises(
            torch.AcceleratorError, match=r"(?s)div_floor_stub: ZeroDivisionError.*OPENREG_LAUNCH_BLOCKING=1"
        ):
            out[0].cpu()
    # Reported once; later work runs.
    assert torch.equal((a + 1).cpu(), torch.tensor([6, 7]))
    torch.openreg.synchronize()


@pytest.mark.parametrize(
    "sync",
    [
        pytest.param(lambda: torch.openreg.synchronize(), id="synchronize"),
        pytest.param(lambda: torch.openreg.current_stream().synchronize(), id="stream"),
        pytest.param(lambda: torch.openreg.current_stream().query(), id="query"),
    ],
)
def test_each_synchronising_call_reports_a_kernel_error(sync):
    a = torch.tensor([1], device=DEVICE)
    launched_before(lambda: torch.div(a, a, rounding_mode="floor"))
    zero = torch.zeros_like(a)
    busy(50)
    if launch_failing_kernel(lambda: torch.div(a, zero, rounding_mode="floor")):
        time.sleep(0.2)  # the kernel has run: query() reports rather than "not ready"
        with pytest.raises(torch.AcceleratorError, match="ZeroDivisionError"):
            sync()
    sync()  # reported once


def run_script(code: str, unset: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if k not in unset}, **env},
    )


def test_launch_blocking_raises_at_the_launch():
    result = run_script(
        """
        import torch
        a = torch.tensor([5, 6], device="openreg")
        torch.div(a, a, rounding_mode="floor")  # queued, were launches not blocking
        try:
            torch.div(a, torch.zeros_like(a), rounding_mode="floor")
        except RuntimeError as e:
            print("raised at the launch:", type(e).__name__, e)
        torch.openreg._sleep(200)
        import time
        start = time.perf_counter()
        y = a + 1
        print("launch waited", (time.perf_counter() - start) * 1e3 > 100)
        """,
        OPENREG_LAUNCH_BLOCKING="1",
    )
    assert result.returncode == 0, result.stderr
    # The kernel ran in the calling thread: its own error, as CPU raises it.
    assert "raised at the launch: RuntimeError ZeroDivisionError" in result.stdout
    assert "OPENREG_LAUNCH_BLOCKING=1 to raise" not in result.stdout
    assert "launch waited True" in result.stdout


@pytest.mark.modes()  # a child process's start-up, the same under every launch switch
@pytest.mark.parametrize("variable", ["OPENREG_LAUNCH_BLOCKING", "OPENREG_QUEUE_ALL_KERNELS"])
def test_a_bad_launch_switch_value_is_an_error_naming_the_variable(variable):
    result = run_script("import torch; torch.zeros(1, device='openreg')", **{variable: "yes"})
    assert result.returncode != 0
    assert f"{variable}='yes' is neither 1 nor 0" in result.stderr


def test_kernels_see_the_launching_thread_count():
    # CPU's reduction splits work by thread count; the worker must use the caller's.
    x = torch.randn(1 << 18)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(x.to(DEVICE).sum().cpu(), x.sum())
    finally:
        torch.set_num_threads(previous)


TEAM_MASKS = """
    import json, os, threading, torch
    def masks():  # {thread id: the CPUs it may run on}
        return {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
    x = torch.randn(1 << 20, device="openreg")
    rounds = []
    for threads in (len(os.sched_getaffinity(0)), 1):
        torch.set_num_threads(threads)
        for _ in range(3):  # the first call of a new geometry runs at once, the others are queued
            (x + x).sum()
        torch.openreg.synchronize()
        rounds.append(masks())
    print(json.dumps({"main": threading.get_native_id(), "cpus": sorted(os.sched_getaffinity(0)), "rounds": rounds}))
"""
PLACEMENT_VARIABLES = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")


def team_masks(**env):
    # Queued kernels: with OPENREG_LAUNCH_BLOCKING=1 each runs in the launching thread, and no worker has a team.
    result = run_script(TEAM_MASKS, unset=PLACEMENT_VARIABLES, **{"OPENREG_LAUNCH_BLOCKING": "0", **env})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    return out["main"], out["cpus"], [{int(t): m for t, m in r.items()} for r in out["rounds"]]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: a team has nowhere to spread")
def test_a_workers_team_is_bound_one_thread_to_a_cpu_and_the_launching_thread_left_free():
    main, cpus, (full, one) = team_masks()
    # A team as large as the CPUs: the worker and its helpers, one on each CPU.
    bound = {t: m for t, m in full.items() if len(m) == 1}
    assert sorted(m[0] for m in bound.values()) == cpus, full
    assert full[main] == cpus  # the launching thread and CPU's own threads stay free
    assert all(m == cpus for t, m in full.items() if t not in bound)
    # A team of one: the worker is free again (its idle helpers keep their CPUs).
    assert sum(one[t] == cpus for t in bound) == 1, one


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: a team has nowhere to spread")
def test_a_team_is_left_where_the_user_placed_openmps_threads():
    # OMP_PROC_BIND=false: the user asked for no binding, and gets none.
    main, cpus, rounds = team_masks(OMP_PROC_BIND="false")
    assert all(m == cpus for r in rounds for m in r.values()), rounds


def test_a_thousand_launches_complete_in_order():
    x = torch.zeros(16, device=DEVICE)
    for i in range(1000):
        x = x + 1
    assert torch.equal(x.cpu(), torch.full((16,), 1000.0))


def blocked_times():
    """How often the calling thread has blocked, giving up its core to wait."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw


def queue_sleeps(count, ms):
    for _ in range(count):
        torch.openreg._sleep(ms)


def test_a_thread_synchronizing_behind_many_tasks_is_woken_once():
    # The worker wakes a blocked thread once the position it waits for has
    # completed, not at every completion: each wake took a core from the kernels.
    stream = torch.openreg.Stream()
    with torch.openreg.stream(stream):
        queue_sleeps(100, 1)
    before = blocked_times()
    stream.synchronize()
    # A wake per completion would be 100; a loaded machine adds a few (the stream's lock).
    assert blocked_times() - before <= 10


@pytest.mark.exclusive  # the count depends on how fast the stream's worker drains beside the launches
@pytest.mark.skipif(BLOCKING, reason="each launch waits for its own kernel, so no queue fills")
def test_a_launch_that_finds_the_queue_full_waits_for_a_quarter_of_it_to_complete():
    # At most 1024 tasks are pending; a launch beyond them waits until 256 have
    # completed, so the launching thread blocks once per 256 launches, not per launch.
    stream = torch.openreg.Stream()
    with torch.openreg.stream(stream):
        queue_sleeps(1024, 0.2)
        before = blocked_times()
        queue_sleeps(512, 0.2)
        blocked = blocked_times() - before
        stream.synchronize()
    # 2 waits; blocking per launch would be 512; a loaded machine adds a few (the stream's lock).
    assert blocked <= 16


def test_tensors_dropped_while_their_kernel_is_queued_stay_valid():
    busy()
    outs = [torch.full((1000,), float(i), device=DEVICE) * 2 for i in range(20)]
    # The inputs of the queued multiplications were temporaries, already dropped.
    for i, out in enumerate(outs):
        assert torch.equal(out.cpu(), torch.full((1000,), 2.0 * i))


def test_a_queued_kernel_reads_a_cpu_operand_as_it_was_at_the_launch_and_a_python_scalar_without_a_copy():
    # Host memory is not stream ordered: a queued kernel keeps a copy of a CPU
    # tensor operand, as CUDA passes its value. A Python scalar (ATen's wrapped
    # number) has no other owner that could write to it, so it is not copied.
    x = torch.ones(4096, device=DEVICE)
    scale = torch.tensor(2.0)
    launched_before(lambda: x * scale)
    busy()
    out = x * scale
    scale.fill_(5.0)
    assert torch.equal(out.cpu(), torch.full((4096,), 2.0))

    launched_before(lambda: x * 3.0)
    busy()
    with torch.profiler.profile() as prof:
        out = x * 3.0
    torch.openreg.synchronize()
    assert torch.equal(out.cpu(), torch.full((4096,), 3.0))
    assert "aten::clone" not in {e.key for e in prof.key_averages()}


def test_dropping_tensors_a_queued_kernel_uses_frees_their_memory_at_once():
    # As on CUDA: a kernel holds pointers, not tensors; the freed blocks go to
    # later work on the same stream, which runs after the kernel.
    x = torch.randn(1 << 20, device=DEVICE)
    launched_before(lambda: x * 2)
    gc.collect()  # earlier tests' garbage, freed now rather than during the count
    before = torch.openreg.memory_allocated()
    busy()
    y = x * 2
    del x, y
    assert torch.openreg.memory_allocated() == before - (4 << 20)
    z = torch.full((1 << 20,), 3.0, device=DEVICE)  # reuses a block, after the multiplication
    assert torch.equal(z.cpu(), torch.full((1 << 20,), 3.0))


def test_under_deterministic_algorithms_kernels_run_at_once_so_they_see_the_flag():
    # CPU's index_copy loops serially under the flag, so the last of duplicate
    # indices wins, as on CPU; a kernel queued behind busy work and run after
    # the guard restored the flag would loop in parallel.
    from torch.testing._internal.common_utils import DeterministicGuard

    x = torch.zeros(5, 2000, 3, device=DEVICE)
    index = torch.randint(2000, (40000,), device=DEVICE)
    src = torch.rand(5, 40000, 3, device=DEVICE)
    with DeterministicGuard(True):
        expected = torch.index_copy(x.cpu(), 1, index.cpu(), src.cpu())
    for _ in range(2):
        busy(30)
        with DeterministicGuard(True):
            y = torch.index_copy(x, 1, index, src)
        assert torch.equal(y.cpu(), expected)
