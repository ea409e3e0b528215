"""AOTInductor packages and Inductor's C++ wrapper (cpp_wrapper=True) on openreg.

The C++ wrapper calls each generated C++ kernel through openreg (kernel addresses
of its tensors, queued on the stream: docs/integration/compiler.md) and each extern kernel through
openreg's C shims, which dispatch to openreg's kernels. The oracle is the same graph
compiled for the CPU: it runs the same C++ kernels and the same BLAS calls, so the
results are bitwise equal. Packages are compiled once per module (a compile costs
seconds).
"""

import ctypes
import gc
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._inductor import metrics
from torch._inductor.utils import fresh_cache, run_and_get_code

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

# Its module fixture is built once: one pytest-xdist worker runs the file.
pytestmark = pytest.mark.xdist_group("aoti")

LAUNCH = "openreg_inductor::launch<"


class Model(torch.nn.Module):
    """Generated kernels (bias, GELU, sum), extern kernels (addmm) and constants."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(x))
        return self.fc2(h * 2 + 1).softmax(-1), x.sin().sum(0)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def built_once(config, tmp_path_factory, name: str, inputs: list[str], build) -> Path:
    """A directory where build(directory) left its outputs, kept in pytest's cache
    while torch and the bytes of `inputs` stay the same: .ci/run's launch-switch
    passes run what its whole-suite pass compiled (compiling runs nothing these
    tests check). Without pytest's cache, a fresh temporary directory."""
    if getattr(config, "cache", None) is None:
        directory = tmp_path_factory.mktemp(name)
        build(directory)
        return directory
    digest = hashlib.sha256(f"{torch.__version__} {torch.version.git_version}".encode())
    for path in sorted(inputs):
        with open(path, "rb") as f:
            digest.update(path.encode() + b"\0" + f.read())
    root = config.cache.mkdir(f"openreg-{name}")
    directory = root / digest.hexdigest()[:16]
    if not directory.is_dir():
        for stale in root.iterdir():
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=root))
        build(staging)
        try:
            staging.rename(directory)
        except OSError:  # another run built it first
            shutil.rmtree(staging)
    return directory


def openreg_inputs() -> list[str]:
    """What a package or program built against torch_openreg depends on: its
    extension and its Python code (the Inductor backend)."""
    import torch_openreg

    package = os.path.dirname(torch_openreg.__file__)
    return [torch_openreg._C.__file__, *glob.glob(os.path.join(package, "**", "*.py"), recursive=True)]


@pytest.fixture(scope="module")
def packages(pytestconfig, tmp_path_factory):
    """(model on CPU, openreg package path, CPU package path) of one Model, built
    once (built_once).

    Compiled in a cache directory of its own: with pytest -n, every worker that
    runs these tests compiles the same model, and a package made while another
    worker rewrote a file of the shared cache could hold an empty JSON file."""
    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(4, 16)

    def build(directory):
        with torch.no_grad(), inductor_config.patch(fx_graph_cache=False), fresh_cache():
            for device in ("openreg", "cpu"):
                exported = torch.export.export(model.to(device), (x.to(device),))
                torch._inductor.aoti_compile_and_package(exported, package_path=str(directory / f"model_{device}.pt2"))

    directory = built_once(pytestconfig, tmp_path_factory, "aoti-packages", [__file__, *openreg_inputs()], build)
    return model.cpu(), str(directory / "model_openreg.pt2"), str(directory / "model_cpu.pt2")


@pytest.fixture(autouse=True)
def _fresh_compilation():
    """Each test compiles for itself (no frames or FX graphs cached by another test);
    compiled C++ is still reused from Inductor's on-disk cache."""
    torch._dynamo.reset()
    metrics.reset()
    with inductor_config.patch(fx_graph_cache=False, cpp_wrapper=True), torch._functorch.config.patch(
        enable_autograd_cache=False
    ):
        yield
    torch._dynamo.reset()
    gc.collect()


def compile_and_run(fn, *args):
    out, sources = run_and_get_code(torch.compile(fn), *args)
    return out, "\n".join(sources)


def compiled_on_cpu(fn, *args):
    torch._dynamo.reset()
    return torch.compile(fn)(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])


def test_cpp_wrapper_runs_generated_kernels_on_device_memory():
    def fn(x, y):
        return (x * y + 1).relu().sum(0), (x - y).exp()

    x_cpu, y_cpu = torch.randn(64, 33), torch.randn(33)
    out, source = compile_and_run(fn, x_cpu.to("openreg"), y_cpu.to("openreg"))

    assert metrics.generated_kernel_count >= 1
    assert LAUNCH in source
    assert "cached_torch_device_type_privateuse1" in source  # buffers on openreg
    assert ".data_ptr()" not in source.split("cpp_wrapper_src", 1)[-1]  # no device address reaches a kernel
    want = compiled_on_cpu(fn, x_cpu, y_cpu)
    for got, w in zip(out, want):
        assert got.device.type == "openreg"
        assert torch.equal(got.cpu(), w)
    for got, w in zip(out, fn(x_cpu, y_cpu)):
        torch.testing.assert_close(got.cpu(), w)


def test_cpp_wrapper_extern_kernels_dispatch_to_openreg():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x_cpu = torch.randn(8, 16)
    with torch.no_grad():
        out, source = compile_and_run(model.to("openreg"), x_cpu.to("openreg"))
        want = compiled_on_cpu(model.cpu(), x_cpu)

    assert re.search(r"aoti_torch_openreg_(addmm|mm)_out\(", source)
    assert "#define aoti_torch_openreg_addmm_out OPENREG_C_SHIM(addmm_out)" in source
    assert torch.equal(out.cpu(), want)


def test_cpp_wrapper_graph_on_second_device_allocates_there():
    def fn(x):
        return (x + 1).mul(x).sum(0)

    x_cpu = torch.randn(10, 10)
    out, source = compile_and_run(fn, x_cpu.to("openreg:1"))

    assert re.search(r"aoti_torch_empty_strided\(.*cached_torch_device_type_privateuse1, 1,", source)
    assert out.device == torch.device("openreg:1")
    torch.testing.assert_close(out.cpu(), fn(x_cpu))


def test_cpp_wrapper_kernel_runs_after_copies_queued_on_the_stream():
    def fn(x):
        return x * 3 + 1

    compiled = torch.compile(fn)
    compiled(torch.zeros(1024, device="openreg"))
    src = torch.arange(1024, dtype=torch.float32).pin_memory()
    dst = torch.zeros(1024, device="openreg")
    torch.openreg._sleep(50)  # keeps the current stream busy ...
    dst.copy_(src, non_blocking=True)  # ... so this copy is still queued behind it
    out = compiled(dst)  # the kernel must run after the copy
    torch.testing.assert_close(out.cpu(), src * 3 + 1)


def test_cpp_wrapper_kernel_is_queued_on_the_stream_behind_queued_work():
    # Like the Python wrapper's kernels (tests/test_compile.py): behind queued
    # work the kernel is queued, and the call returns; with
    # OPENREG_LAUNCH_BLOCKING=1 it runs before the call returns.
    blocking = os.environ.get("OPENREG_LAUNCH_BLOCKING", "0") == "1"

    def fn(x):
        return (x.cos() * 2).relu()

    compiled = torch.compile(fn)
    x = torch.randn(256, 256, device="openreg")
    compiled(x)
    torch.openreg.synchronize()
    stream = torch.openreg.current_stream()
    queued = lambda: torch.openreg._C._stream_queued_count(stream.stream_id, stream.device_index)  # noqa: E731
    torch.openreg._sleep(100)
    count = queued()
    out = compiled(x)
    assert (queued() > count) is not blocking
    # The oracle is the same graph compiled for CPU (the same generated kernel):
    # eager CPU's cos runs MKL's VML, whose first call from two threads can give
    # one thread's share (the OpenMP helper's rows) VML's low-accuracy result,
    # up to 3.0e-4 off, though torch passes VML_HA on each call: oneMKL's race
    # (pytorch/pytorch#188792; docs/conformance.md, "MKL's first call").
    torch.testing.assert_close(out.cpu(), compiled_on_cpu(fn, x))


def test_cpp_wrapper_mixes_cpu_and_openreg_tensors():
    def fn(x, y):
        return x.sin() + 1, y.cos()

    x_cpu, y_cpu = torch.randn(32), torch.randn(32)
    (a, b), _ = compile_and_run(fn, x_cpu.to("openreg"), y_cpu)
    assert a.device.type == "openreg" and b.device.type == "cpu"
    torch.testing.assert_close(a.cpu(), x_cpu.sin() + 1)
    torch.testing.assert_close(b, y_cpu.cos())


def test_aoti_package_runs_on_openreg_bitwise_equal_to_the_cpu_package(packages):
    model, openreg_path, cpu_path = packages
    x = torch.randn(4, 16)
    on_openreg = torch._inductor.aoti_load_package(openreg_path)
    on_cpu = torch._inductor.aoti_load_package(cpu_path)
    assert on_openreg.loader.get_metadata()["AOTI_DEVICE_KEY"] == "openreg"

    got = on_openreg(x.to("openreg"))
    want = on_cpu(x)
    with torch.no_grad():
        eager = model(x)
    for g, w, e in zip(got, want, eager):
        assert g.device == torch.device("openreg:0")
        assert torch.equal(g.cpu(), w)
        torch.testing.assert_close(g.cpu(), e)
    # A second run uses the constants the first copied to the device.
    for g, w in zip(on_openreg(x.to("openreg")), want):
        assert torch.equal(g.cpu(), w)


def test_aoti_package_runs_after_copies_queued_on_the_stream(packages):
    _, openreg_path, cpu_path = packages
    on_openreg = torch._inductor.aoti_load_package(openreg_path)
    on_openreg(torch.zeros(4, 16, device="openreg"))
    src = torch.randn(4, 16).pin_memory()
    dst = torch.zeros(4, 16, device="openreg")
    torch.openreg._sleep(50)  # keeps the current stream busy ...
    dst.copy_(src, non_blocking=True)  # ... so this copy is still queued behind it
    got = on_openreg(dst)  # the model's kernels must run after the copy
    want = torch._inductor.aoti_load_package(cpu_path)(src.clone())
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)


def test_aoti_package_loads_on_the_device_index_it_is_given(packages):
    _, openreg_path, cpu_path = packages
    x = torch.randn(4, 16)
    on_second = torch._inductor.aoti_load_package(openreg_path, device_index=1)
    got = on_second(x.to("openreg:1"))
    want = torch._inductor.aoti_load_package(cpu_path)(x)
    for g, w in zip(got, want):
        assert g.device == torch.device("openreg:1")
        assert torch.equal(g.cpu(), w)


def test_cpu_package_refuses_openreg_inputs_naming_both_devices(packages):
    _, _, cpu_path = packages
    on_cpu = torch._inductor.aoti_load_package(cpu_path)
    gc.collect()  # earlier tests' garbage, freed now rather than during the count
    torch.openreg.synchronize()
    baseline = torch.openreg.memory_allocated()
    with pytest.raises(RuntimeError, match=r"compiled for cpu, and its input 0 is on openreg:0"):
        on_cpu(torch.randn(4, 16, device="openreg"))
    # The refused input's handle is freed with it.
    assert torch.openreg.memory_allocated() == baseline


def test_openreg_package_refuses_cpu_inputs_naming_both_devices(packages):
    _, openreg_path, _ = packages
    on_openreg = torch._inductor.aoti_load_package(openreg_path)
    with pytest.raises(RuntimeError, match=r"compiled for openreg \(loaded for openreg.*\), and its input 0 is on cpu"):
        on_openreg(torch.randn(4, 16))
    assert torch.equal(on_openreg(torch.ones(4, 16, device="openreg"))[0].cpu(),
                       on_openreg(torch.ones(4, 16, device="openreg"))[0].cpu())


class Shims:
    """openreg's C shims called as the C++ wrapper calls them: looked up by name in
    torch_openreg._C, given AtenTensorHandles (at::Tensor*) made by torch._C._aoti."""

    def __init__(self):
        import torch_openreg

        self._lookup = ctypes.CDLL(torch_openreg._C.__file__).openreg_inductor_function
        self._lookup.restype, self._lookup.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
        self._pointer = ctypes.pythonapi.PyCapsule_GetPointer
        self._pointer.restype, self._pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        self._capsule = ctypes.pythonapi.PyCapsule_New
        self._capsule.restype, self._capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    def function(self, name, *argtypes):
        address = self._lookup(name.encode())
        assert address, f"torch_openreg._C has no {name}"
        return ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(address)

    def handle(self, tensor):
        """A new handle of `tensor` (a new at::Tensor of the same TensorImpl)."""
        return self._pointer(torch._C._aoti.unsafe_alloc_void_ptr_from_tensor(tensor), None)

    def take(self, handle):
        """The tensor of `handle`, which is freed."""
        return torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(self._capsule(handle, None, None))


def test_method_only_operators_have_c_shims():
    """bernoulli_, view.dtype, set_ and resize_ have no at::<op> function; their shims
    call the dispatcher entry (codegen/emit/inductor_shims.py)."""
    shims = Shims()
    void_p = ctypes.c_void_p
    x = torch.arange(4, dtype=torch.float32, device="openreg")
    view = shims.function("aoti_torch_openreg_view_dtype", void_p, ctypes.c_int32, ctypes.POINTER(void_p))
    handle, out = shims.handle(x), void_p()
    assert view(handle, 3, ctypes.byref(out)) == 0  # 3: c10::ScalarType::Int
    assert torch.equal(shims.take(out.value).cpu(), x.cpu().view(torch.int32))
    shims.take(handle)

    bernoulli = shims.function("aoti_torch_openreg_bernoulli__float", void_p, ctypes.c_double, void_p)
    z = torch.empty(1000, device="openreg")
    handle = shims.handle(z)
    torch.manual_seed(0)
    assert bernoulli(handle, 0.5, None) == 0
    shims.take(handle)
    torch.manual_seed(0)
    assert torch.equal(z.cpu(), torch.empty(1000).bernoulli_(0.5))

    set_ = shims.function("aoti_torch_openreg_set__source_Tensor", void_p, void_p)
    target, source = torch.empty(0, device="openreg"), torch.randn(3, device="openreg")
    handles = shims.handle(target), shims.handle(source)
    assert set_(*handles) == 0
    for h in handles:
        shims.take(h)
    assert target.data_ptr() == source.data_ptr() and torch.equal(target.cpu(), source.cpu())

    resize = shims.function(
        "aoti_torch_openreg_resize_", void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, void_p
    )
    handle = shims.handle(target)
    assert resize(handle, (ctypes.c_int64 * 2)(2, 5), 2, None) == 0
    shims.take(handle)
    assert target.shape == (2, 5) and target.device.type == "openreg"


@pytest.fixture(scope="module")
def run_package(pytestconfig, tmp_path_factory):
    """examples/aoti/run_package, built against this torch and torch_openreg (once: built_once)."""
    # build.py links the torch_openreg this process imported.
    import torch_openreg

    example = os.path.join(ROOT, "examples", "aoti")

    def build(directory):
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(torch_openreg.__file__)))
        built = subprocess.run(
            [sys.executable, os.path.join(example, "build.py"), str(directory / "run_package")],
            capture_output=True, text=True, env=env,
        )
        assert built.returncode == 0, built.stdout + built.stderr

    inputs = [*glob.glob(os.path.join(example, "*")), *openreg_inputs()]
    return str(built_once(pytestconfig, tmp_path_factory, "aoti-example", inputs, build) / "run_package")


def test_cpp_example_runs_the_package_on_openreg_without_python(packages, run_package):
    _, openreg_path, cpu_path = packages
    ran = subprocess.run([run_package, openreg_path], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "device openreg"
    outputs = [
        torch.tensor([float(v) for v in values.split()])
        for header, values in zip(lines[1::2], lines[2::2])
        if header.startswith("output openreg:0")
    ]
    # The same input on the CPU package (run_package.cpp).
    x = (torch.arange(64, dtype=torch.float32).reshape(4, 16) / 10)
    want = torch._inductor.aoti_load_package(cpu_path)(x)
    assert len(outputs) == len(want)
    for got, w in zip(outputs, want):
        assert torch.equal(got, w.flatten())  # 9 significant digits print a float exactly
