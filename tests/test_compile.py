"""torch.compile on openreg: Inductor's C++ kernels on device memory, and aot_eager.

The oracle is eager mode on the CPU. Inductor tests also check the generated wrapper:
a compile that silently fell back to eager would produce the right numbers, so each
one asserts that Inductor generated C++ kernels and that the wrapper calls them on
openreg's CPU aliases (docs/integration/compiler.md).
"""

import copy
import gc
import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._dynamo.device_interface import get_interface_for_device
from torch._dynamo.utils import counters
from torch._inductor import metrics
from torch._inductor.exc import InductorError
from torch._inductor.utils import fresh_cache, run_and_get_code
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_openreg.openreg._inductor as openreg_inductor
from torch_openreg.openreg._dynamo import OpenRegInterface

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

F = torch.nn.functional

KERNEL_CALL = "(*openreg_kernel_arguments("


@pytest.fixture(autouse=True)
def _fresh_compilation():
    """Every test compiles for itself: no frames cached by an earlier test, and no
    FX graph / AOTAutograd cache hit that would skip code generation (compiled C++
    kernels are still reused from Inductor's on-disk cache, which keeps this file fast)."""
    torch._dynamo.reset()
    metrics.reset()
    with inductor_config.patch(fx_graph_cache=False), torch._functorch.config.patch(
        enable_autograd_cache=False
    ):
        yield
    torch._dynamo.reset()
    # A failed compilation leaves reference cycles (exception, frames) that hold
    # its openreg inputs; collect them so later tests see the memory free.
    gc.collect()


def compile_and_run(fn, *args, **compile_kwargs):
    """Runs torch.compile(fn) with Inductor; returns the result and the wrapper source."""
    out, sources = run_and_get_code(torch.compile(fn, **compile_kwargs), *args)
    return out, "\n".join(sources)


def assert_ran_cpp_kernels(source, count=None):
    assert metrics.generated_kernel_count >= 1, "Inductor generated no kernel"
    if count is not None:
        assert metrics.generated_kernel_count == count
    assert "openreg_cpp_pybinding(async_compile, " in source, "openreg's bindings launch the C++ kernels"
    assert KERNEL_CALL in source, "the wrapper must call C++ kernels on CPU aliases"


def test_dynamo_finds_the_openreg_device_interface():
    assert get_interface_for_device("openreg") is OpenRegInterface
    assert get_interface_for_device("openreg:1") is OpenRegInterface
    assert OpenRegInterface.Stream is torch.openreg.Stream
    assert OpenRegInterface.device_count() == torch.openreg.device_count()
    props = OpenRegInterface.Worker.get_device_properties("openreg:0")
    assert props.multi_processor_count == torch.openreg.get_device_properties(0).multi_processor_count
    assert OpenRegInterface.get_compute_capability() == 10 * torch.openreg.get_device_capability()[0]
    with OpenRegInterface.device(1):
        assert OpenRegInterface.current_device() == 1
    previous = OpenRegInterface.exchange_device(1)
    assert OpenRegInterface.current_device() == 1
    OpenRegInterface.maybe_exchange_device(previous)
    assert OpenRegInterface.current_device() == previous


@pytest.mark.modes()  # a child process's start-up, the same under every launch switch
def test_import_torch_does_not_import_dynamo_or_inductor():
    # The registrations wait for those modules (torch_openreg/_import_hooks.py).
    code = (
        "import sys, torch, torch_openreg\n"
        "assert torch.openreg.is_available()\n"
        "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_elementwise_chain_fuses_into_one_cpp_kernel():
    def fn(x, y):
        return torch.sigmoid(x * 2 + y).relu() - torch.tanh(y) / 3

    x_cpu, y_cpu = torch.randn(33, 17), torch.randn(17, 33).t()  # y is not contiguous
    out, source = compile_and_run(fn, x_cpu.openreg(), y_cpu.openreg())

    assert_ran_cpp_kernels(source, count=1)
    assert out.device == torch.device("openreg:0")
    torch.testing.assert_close(out.cpu(), fn(x_cpu, y_cpu))


def test_reductions_match_eager():
    def fn(x):
        return x.sum(0), x.amax(1), x.mean(), torch.softmax(x, dim=-1), x.var(1)

    x_cpu = torch.randn(64, 129)
    out, source = compile_and_run(fn, x_cpu.openreg())

    assert_ran_cpp_kernels(source)
    for got, want in zip(out, fn(x_cpu)):
        torch.testing.assert_close(got.cpu(), want)


def test_float16_is_computed_as_on_cpu():
    # Kernels are generated as CPU kernels: float16 loads and stores convert
    # exactly as they do on the CPU, so the results are bitwise the CPU's.
    def fn(x):
        return (x * x + 1).rsqrt().sum(-1)

    x_cpu = torch.randn(8, 40, dtype=torch.float16)
    out, source = compile_and_run(fn, x_cpu.openreg())
    torch._dynamo.reset()
    want = torch.compile(fn)(x_cpu)

    assert_ran_cpp_kernels(source)
    assert out.dtype == torch.float16
    assert torch.equal(out.cpu(), want)
    torch.testing.assert_close(out.cpu(), fn(x_cpu))


def cpp_kernels(source):
    """The C++ source of each kernel of a wrapper module, in order (with its argument
    types): CPU's wrapper loads it with async_compile.cpp_pybinding, openreg's with
    openreg_cpp_pybinding(async_compile, ...)."""
    return re.findall(r"(?:async_compile\.cpp_pybinding\(|openreg_cpp_pybinding\(async_compile, )(.*?'''\))",
                      source, re.S)


def compile_on_cpu_and_openreg(fn, *args_cpu):
    """Compiles and runs fn on the CPU, then on openreg; returns both results (a
    tuple of CPU tensors each) and both wrapper sources."""
    torch._dynamo.reset()
    want, source_cpu = compile_and_run(fn, *args_cpu)
    torch._dynamo.reset()
    got, source = compile_and_run(fn, *(a.openreg() for a in args_cpu))
    return tuple(t.cpu() for t in got), tuple(want), source_cpu, source


def _reused_exp_in_bfloat16(x):
    y = (x.exp() * 2).to(torch.bfloat16)
    return y.float() + 1, y.float().sum(0)


# One graph per lowering decision of Inductor that tests the CPU device and that
# openreg takes too (torch_openreg/openreg/_inductor_lowering.py): function,
# input shape, tolerance against eager.
CPU_LOWERING_CHOICES = {
    # var_mean with two passes, not Welford.
    "layer_norm": (lambda x: (F.layer_norm(x, (100,)),), (8, 100), {}),
    # A true division, not a multiplication by the reciprocal 1/3.
    "division_by_a_constant": (lambda x: (x / 3.0,), (1000,), {}),
    # exp, used twice, is computed once and stored in bfloat16, not recomputed in
    # float32 by the reduction (ir.is_cpu in should_realize_on_reuse). Compiled
    # code skips the rounding to bfloat16 inside a kernel, on both devices, so it
    # is as close to eager as bfloat16 is.
    "reused_exp_in_bfloat16": (_reused_exp_in_bfloat16, (64, 64), dict(rtol=1.6e-2, atol=1e-5)),
    # The row-major index of the maximum of a transpose, not the kernel's loop index.
    "argmax_of_a_transpose": (lambda x: (torch.argmax(x.t()),), (30, 40), {}),
}


@pytest.mark.parametrize("case", CPU_LOWERING_CHOICES)
def test_inductor_generates_the_cpus_kernels_for_openreg(case):
    # Compiled openreg code is compiled CPU code on device memory, kernel for
    # kernel, so it computes bitwise what compiled CPU code computes.
    fn, shape, tolerance = CPU_LOWERING_CHOICES[case]
    x_cpu = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    got, want, source_cpu, source = compile_on_cpu_and_openreg(fn, x_cpu)

    assert_ran_cpp_kernels(source)
    assert cpp_kernels(source) == cpp_kernels(source_cpu)
    for g, w, eager in zip(got, want, fn(x_cpu), strict=True):
        assert torch.equal(g, w)
        torch.testing.assert_close(g, eager, **tolerance)


def test_fx_graph_cache_key_covers_openregs_code_generation():
    # A graph cached by another version of openreg's code generation (one that
    # lowered LayerNorm with Welford, say) must not be reused: the key hashes
    # the files that shape openreg's graphs through CodegenVersion.uuid, and the
    # configuration the lowering choices read.
    files = set(openreg_inductor._CODEGEN_FILES)
    assert {openreg_inductor.__file__, openreg_inductor._inductor_lowering.__file__,
            openreg_inductor._fake_tensor.__file__} <= files

    def fn(x):
        return F.layer_norm(x, (16,))

    x = torch.randn(4, 16, device="openreg")

    def compile_counting_hits():
        torch._dynamo.reset()
        counters.clear()
        torch.compile(fn)(x)
        return counters["inductor"]["fxgraph_cache_hit"]

    with fresh_cache(), inductor_config.patch(fx_graph_cache=True):
        assert compile_counting_hits() == 0
        assert compile_counting_hits() == 1
        with inductor_config.patch({"cpp.use_two_step_variance_threshold": 8}):
            assert compile_counting_hits() == 0
        another_version = lambda self: b"another version of openreg's code generation"  # noqa: E731
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(openreg_inductor.CodegenVersion, "uuid", another_version)
            assert compile_counting_hits() == 0


def test_mlp_forward_and_backward_match_eager():
    torch.manual_seed(0)
    model_cpu = torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    ).openreg()
    model.load_state_dict(model_cpu.state_dict())
    x_cpu, target_cpu = torch.randn(16, 12), torch.randn(16, 4)

    def step(model, x, target):
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        return loss

    compiled = torch.compile(step)
    loss, (forward, backward) = run_and_get_code(compiled, model, x_cpu.openreg(), target_cpu.openreg())
    want = step(model_cpu, x_cpu, target_cpu)

    for source in (forward, backward):
        assert KERNEL_CALL in source
    assert "extern_kernels.addmm" in forward  # mm stays an aten call on openreg
    torch.testing.assert_close(loss.cpu(), want)
    for p, p_cpu in zip(model.parameters(), model_cpu.parameters()):
        assert p.grad.device.type == "openreg"
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad)


def test_dynamic_shapes_compile_once_for_all_sizes():
    def fn(x):
        return (x.cos() * 2).sum(-1)

    compiled = torch.compile(fn, dynamic=True)
    _, (source,) = run_and_get_code(compiled, torch.randn(5, 7).openreg())
    # The sizes are kernel arguments (symbols such as s77), not constants.
    call_args = source.split(KERNEL_CALL)[1].split(", (")[1].split(")")[0]
    assert re.search(r"\bs\d+\b", call_args), call_args
    for n in (3, 11, 20):
        x_cpu = torch.randn(n, n + 1)
        torch.testing.assert_close(compiled(x_cpu.openreg()).cpu(), fn(x_cpu))
    assert metrics.generated_kernel_count == 1  # no recompilation


def test_cpu_fallback_operators_and_custom_ops_mix_with_compiled_kernels():
    # linalg_inv_ex has no openreg kernel: the compiled wrapper calls it as an aten
    # operator, which runs on the CPU fallback between two generated kernels.
    def fn(x, y):
        a = torch.ops.openreg.add_relu(x @ x.mT, y) + torch.eye(x.shape[0], device=x.device)
        return torch.linalg.inv(a).exp()

    x_cpu, y_cpu = torch.randn(6, 6), torch.rand(6, 6)
    torch.openreg.reset_fallback_stats()
    out, source = compile_and_run(fn, x_cpu.openreg(), y_cpu.openreg())

    assert_ran_cpp_kernels(source)
    assert "torch.ops.openreg.add_relu" in source
    assert "aten::linalg_inv_ex.inverse" in torch.openreg.fallback_stats()
    want = torch.linalg.inv(torch.relu(x_cpu @ x_cpu.mT + y_cpu) + torch.eye(6)).exp()
    torch.testing.assert_close(out.cpu(), want)


def test_graph_on_second_device_allocates_and_computes_there():
    def fn(x):
        return (x + 1).mul(x).sum(0)

    x_cpu = torch.randn(10, 10)
    out, source = compile_and_run(fn, x_cpu.to("openreg:1"))

    assert_ran_cpp_kernels(source)
    # Buffers come from openreg's fast allocation call, with the graph's device index.
    assert re.search(r"= empty_strided_openreg\(\(.*\), \(.*\), torch\.float32, 1\)", source)
    assert " = empty_strided(" not in source
    assert out.device == torch.device("openreg:1")
    torch.testing.assert_close(out.cpu(), fn(x_cpu))


def test_compiled_kernel_runs_after_copies_queued_on_the_stream():
    def fn(x):
        return x * 3 + 1

    compiled = torch.compile(fn)
    compiled(torch.zeros(1024, device="openreg"))  # compile outside the timed part
    src = torch.arange(1024, dtype=torch.float32).pin_memory()
    dst = torch.zeros(1024, device="openreg")
    torch.openreg._sleep(50)  # keeps the current stream busy ...
    dst.copy_(src, non_blocking=True)  # ... so this copy is still queued behind it
    out = compiled(dst)  # the kernel must join the stream before reading dst
    torch.testing.assert_close(out.cpu(), src * 3 + 1)


def test_a_compiled_kernel_is_queued_and_the_call_returns_before_it_runs():
    # Generated kernels launch like eager ones (docs/integration/compiler.md, "Launches"):
    # behind queued work the compiled call returns at once, its kernel queued on
    # the stream; with OPENREG_LAUNCH_BLOCKING=1 each kernel runs before the
    # call returns.
    blocking = os.environ.get("OPENREG_LAUNCH_BLOCKING", "0") == "1"

    def fn(x):
        return (x.cos() * 2).relu()

    compiled = torch.compile(fn)
    x = torch.randn(256, 256, device="openreg")  # above the size run at once on an idle stream
    compiled(x)
    torch.openreg.synchronize()
    stream = torch.openreg.current_stream()
    queued = lambda: torch.openreg._C._stream_queued_count(stream.stream_id, stream.device_index)  # noqa: E731
    torch.openreg._sleep(300)
    count = queued()
    start = time.perf_counter()
    out = compiled(x)
    launch_ms = (time.perf_counter() - start) * 1e3
    assert (queued() > count) is not blocking
    start = time.perf_counter()
    torch.openreg.synchronize()
    sync_ms = (time.perf_counter() - start) * 1e3
    waited, returned_at_once = (launch_ms, sync_ms) if blocking else (sync_ms, launch_ms)
    assert returned_at_once < 150 and waited > 75, (launch_ms, sync_ms)
    torch.testing.assert_close(out.cpu(), fn(x.cpu()))


def test_in_place_update_of_an_input_writes_device_memory():
    def fn(x, y):
        x.mul_(2).add_(y)
        return x.sum()

    x_cpu, y_cpu = torch.randn(9, 5), torch.randn(9, 5)
    x = x_cpu.openreg()
    total, source = compile_and_run(fn, x, y_cpu.openreg())

    assert_ran_cpp_kernels(source)
    torch.testing.assert_close(x.cpu(), x_cpu * 2 + y_cpu)
    torch.testing.assert_close(total.cpu(), (x_cpu * 2 + y_cpu).sum())


def test_aot_eager_forward_and_backward_match_eager():
    x_cpu = torch.randn(7, 5, requires_grad=True)
    w_cpu = torch.randn(5, 3, requires_grad=True)
    x = x_cpu.detach().openreg().requires_grad_()
    w = w_cpu.detach().openreg().requires_grad_()

    def fn(x, w):
        return torch.nn.functional.silu(x @ w).sum(0).pow(2).sum()

    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, w)
    out.backward()
    want = fn(x_cpu, w_cpu)
    want.backward()

    torch.testing.assert_close(out.cpu(), want)
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def _conv_args(memory_format, device):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=generator).to(device, memory_format=memory_format)
    w = torch.randn(8, 3, 4, 4, generator=generator).to(device, memory_format=memory_format)
    return x, w, torch.randn(8, generator=generator).to(device)


_CONV = dict(stride=[4, 4], padding=[0, 0], dilation=[1, 1], transposed=False, output_padding=[0, 0], groups=1)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_fake_convolution_predicts_the_strides_openreg_returns(memory_format):
    # openreg's convolution runs CPU's kernel on CPU aliases, so it returns
    # CPU's strides: channels-last when an operand is. Fake tensors (compile,
    # export) must predict them, although _select_conv_backend answers
    # Overrideable for PrivateUse1 (torch_openreg/openreg/_fake_tensor.py).
    def conv_and_backward(x, w, b):
        out = torch.ops.aten.convolution(x, w, b, **_CONV)
        grads = torch.ops.aten.convolution_backward(
            torch.ones_like(out), x, w, [8], **_CONV, output_mask=[True, True, True]
        )
        return (out, *grads)

    cpu = conv_and_backward(*_conv_args(memory_format, "cpu"))
    real = conv_and_backward(*_conv_args(memory_format, "openreg"))
    mode = FakeTensorMode()
    fake_args = [mode.from_tensor(t) for t in _conv_args(memory_format, "openreg")]
    with mode:
        fake = conv_and_backward(*fake_args)

    for c, r, f in zip(cpu, real, fake):
        assert r.stride() == c.stride()
        torch.testing.assert_close(r.cpu(), c)
        assert (f.device, f.shape, f.stride()) == (r.device, r.shape, r.stride())


class _PatchEmbedding(torch.nn.Module):
    """A convolution whose output is flattened: the reshape is a view only if the
    output is contiguous, which is decided from the predicted strides."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 4, stride=4)

    def forward(self, x):
        y = self.conv(x)
        return y.flatten(2), y


def test_inductor_layout_optimization_of_a_convolution_matches_eager():
    # Inductor makes the operands of this convolution channels-last
    # (GraphLowering.decide_layout_opt) and asserts the strides it predicted for
    # the output (assert_size_stride).
    model_cpu = _PatchEmbedding()
    x_cpu = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # an inference graph, whose heuristic takes the layout (ViT's case)
        out, source = compile_and_run(copy.deepcopy(model_cpu).openreg(), x_cpu.openreg())

    assert_ran_cpp_kernels(source)
    assert "assert_size_stride" in source
    for got, want in zip(out, model_cpu(x_cpu)):
        assert got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want)


def test_channels_last_convolution_traces_with_aot_eager_and_export():
    model_cpu = _PatchEmbedding()
    model = copy.deepcopy(model_cpu).openreg()
    x_cpu = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    x = x_cpu.openreg()
    want = model_cpu(x_cpu)

    aot_eager = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    exported = torch.export.export(model, (x,))
    (conv,) = [n for n in exported.graph.nodes if n.target is torch.ops.aten.conv2d.default]
    assert conv.meta["val"].stride() == want[1].stride()
    for out in (aot_eager, exported.module()(x)):
        for got, w in zip(out, want):
            assert got.stride() == w.stride()
            torch.testing.assert_close(got.cpu(), w)


def test_fx_wrapper_is_refused_with_what_to_use_instead():
    # (The C++ wrapper is supported: tests/test_aoti.py.)
    x = torch.randn(4, device="openreg")
    with inductor_config.patch(fx_wrapper=True):
        with pytest.raises(InductorError, match=re.escape("openreg: torch.compile with the FX wrapper")) as info:
            torch.compile(lambda t: t.sin() + 1)(x)
    assert 'backend="aot_eager"' in str(info.value)
