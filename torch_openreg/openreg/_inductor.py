"""Inductor code generation for openreg: torch's C++ CPU kernels, launched on the stream.

An openreg kernel is a CPU kernel run on device memory (docs/architecture.md), so
Inductor's C++ backend (``CppScheduling``: vectorised, OpenMP-parallel loops) already
writes the right kernels for openreg. What differs is how they are called. Inductor's
Python wrapper calls a C++ kernel with the tensors themselves, and the binding glue
that ``CppPythonBindingsCodeCache`` compiles around it reads ``data_ptr()``, which for
an openreg tensor is a device-view address CPU code must not touch
(docs/runtime.md). ``OpenRegWrapperCodegen`` therefore emits each C++ kernel call as

    cpp_fused_add_relu_0(*openreg_kernel_arguments('cpp_fused_add_relu_0', (arg0_1, buf0, 8)))

``torch_openreg._C._kernel_arguments`` replaces every openreg tensor by a CPU tensor
over the same bytes at their kernel-view address (other arguments pass through) and
tells openreg where the kernel goes. The binding (``OpenRegPythonBindingsCodeCache``)
parses the arguments as torch's does, then, instead of calling the kernel, hands it
with its arguments to openreg's ``openreg_launch_host_kernel``, which queues it on the
current stream of the tensors' device, after the work queued before it, exactly where
an eager openreg kernel would go (a small kernel on an idle stream runs at once, and a
kernel that also takes CPU tensors, whose memory is not stream-ordered, runs at once
after the streams' work). Everything else in the wrapper already works on openreg
tensors. Buffers come from the openreg caching allocator through
``torch_openreg._C._empty_strided``, the counterpart of the
``empty_strided_cpu``/``empty_strided_cuda`` Inductor calls for those devices (see
``make_allocation``), and extern kernels (``extern_kernels.mm``, fallback
operators) are aten calls that dispatch to openreg.

``register`` hands these classes to ``register_backend_for_device``, the entry point
torch/_inductor/codegen/common.py names for out-of-tree backends. ``torch_openreg``
calls it once ``torch._inductor.compile_fx`` has been imported (every Inductor
compilation goes through that module, and by then the modules imported here are
loaded), so ``import torch`` does not import Inductor.

Since the kernels are CPU kernels, ``register`` also gives openreg graphs the
lowering choices Inductor makes for the CPU (``_inductor_lowering``), so that a graph
compiles to the kernels it compiles to on the CPU.

The C++ wrapper (``cpp_wrapper=True``, also used by AOTInductor) and the FX wrapper
(``fx_wrapper=True``) are refused with an explanation: see ``OpenRegCppWrapperCodegen``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.async_compile import get_compile_threads
from torch._inductor.codecache import CppPythonBindingsCodeCache, LambdaFuture
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.exc import CppWrapperCodegenError
from torch._inductor.virtualized import V

import torch_openreg._C as _C
from torch_openreg.openreg import _fake_tensor, _inductor_lowering

# The names the generated module calls; imported in its header.
KERNEL_ARGUMENTS = "openreg_kernel_arguments"
EMPTY_STRIDED = "empty_strided_openreg"
CPP_PYBINDING = "openreg_cpp_pybinding"
_IMPORTS = (
    f"from torch_openreg._C import _kernel_arguments as {KERNEL_ARGUMENTS}, _empty_strided as {EMPTY_STRIDED}\n"
    f"from torch_openreg.openreg._inductor import cpp_pybinding as {CPP_PYBINDING}"
)

# Where the bindings find openreg_launch_host_kernel: the binding is built without
# torch's headers and loaded apart from torch_openreg._C, so, as torch passes its
# own helper to its bindings (_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR), the address
# travels through the environment.
_LAUNCH_ENV = "_OPENREG_LAUNCH_HOST_KERNEL"

# Added to the binding after torch's parse_arg helpers (a format string: braces doubled).
_LAUNCH_KERNEL = """
// openreg: the kernel and its arguments handed to openreg_launch_host_kernel, which
// queues them on the current stream of the tensors' device (or runs them at once).
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>
typedef void (*openreg_closure_fn)(void*);
template <typename... P, typename... V>
static void openreg_launch_kernel(void (*fn)(P...), std::tuple<V...> values) {{
    typedef void (*launch_fn)(openreg_closure_fn, void*, openreg_closure_fn);
    static const launch_fn launch = [] {{
        const char* address = std::getenv("%s");
        if (address == nullptr) {{
            throw std::runtime_error("%s is not set: import torch_openreg before loading openreg kernels");
        }}
        return reinterpret_cast<launch_fn>(std::strtoull(address, nullptr, 10));
    }}();
    struct Closure {{
        void (*fn)(P...);
        std::tuple<std::decay_t<P>...> args;
        static void run(void* self) {{
            Closure* closure = static_cast<Closure*>(self);
            std::apply(closure->fn, closure->args);
        }}
        static void release(void* self) {{
            delete static_cast<Closure*>(self);
        }}
    }};
    launch(&Closure::run, new Closure{{fn, std::tuple<std::decay_t<P>...>(std::move(values))}}, &Closure::release);
}}
""" % (_LAUNCH_ENV, _LAUNCH_ENV)


class OpenRegPythonBindingsCodeCache(CppPythonBindingsCodeCache):
    """Inductor's C++ kernels with bindings that launch them on the openreg stream
    instead of calling them (``openreg_launch_kernel`` above)."""

    cache: dict[str, Any] = {}
    call_entry_function = "openreg_launch_kernel(kernel, std::make_tuple({})); Py_RETURN_NONE;"
    extra_parse_arg = _LAUNCH_KERNEL

    @staticmethod
    def cache_clear() -> None:
        OpenRegPythonBindingsCodeCache.cache.clear()

    @classmethod
    def _load_library_inner(cls, path: str, key: str) -> Any:
        os.environ[_LAUNCH_ENV] = str(_C._launch_host_kernel_address())
        return super()._load_library_inner(path, key)


def cpp_pybinding(async_compile: Any, argtypes: list[str], source_code: str) -> Any:
    """``AsyncCompile.cpp_pybinding`` with openreg's launching bindings: the call the
    openreg wrapper emits in its place (``_OpenRegKernelCalls.define_kernel``)."""
    if get_compile_threads() <= 1:
        return OpenRegPythonBindingsCodeCache.load_pybinding(argtypes, source_code)
    get_result = OpenRegPythonBindingsCodeCache.load_pybinding_async(
        argtypes, source_code, submit_fn=async_compile.submit
    )
    return LambdaFuture(get_result)


_CPU = torch.device("cpu")


class OpenRegScheduling(CppScheduling):
    """Inductor's C++/OpenMP kernel generator, run as if the kernels were for the CPU.

    The kernels take raw pointers, and the wrapper hands them kernel-view ones. The
    CPU device during code generation matters: the op handlers pick their kernel
    language with ``get_current_backend()`` of the current device
    (torch/_inductor/utils.py), which maps a device type it does not know to
    ``config.cuda_backend``, i.e. Triton. C++ code generated under that belief
    loses dtypes (an ``eye`` fails an assertion in ``CppVecKernel.arange``) and
    would upcast float16 the Triton way. Only code generation sees the CPU device:
    buffers keep their openreg layouts, and the scheduler's device is restored.
    """

    def codegen_node(self, node: Any) -> None:
        with V.graph.set_current_device(_CPU):
            super().codegen_node(node)

    def codegen_template(self, *args: Any, **kwargs: Any) -> Any:
        with V.graph.set_current_device(_CPU):
            return super().codegen_template(*args, **kwargs)

    def flush(self) -> None:
        with V.graph.set_current_device(_CPU):
            super().flush()


class _OpenRegKernelCalls:
    """What the openreg wrappers (graph and subgraph) change in PythonWrapperCodegen."""

    def _generate_kernel_call_helper(
        self, kernel_name: str, call_args: list[str], *, device: Any = None, triton: bool = True, **kwargs: Any
    ) -> None:
        if triton:
            # Never for openreg (it schedules C++ kernels only); left to Inductor.
            return super()._generate_kernel_call_helper(  # type: ignore[misc]
                kernel_name, call_args, device=device, triton=triton, **kwargs
            )
        # Every C++ kernel of an openreg graph, including those of CPU tensors in
        # a mixed graph: they are all generated under the CPU device (see
        # OpenRegScheduling), and _kernel_arguments passes CPU tensors through
        # (such a kernel runs at once). The trailing comma keeps a one-argument
        # tuple a tuple.
        args = ", ".join(call_args)
        self.writeline(  # type: ignore[attr-defined]
            f"{kernel_name}(*{KERNEL_ARGUMENTS}({kernel_name!r}, ({args},))){self.ending}"  # type: ignore[attr-defined]
        )

    def define_kernel(self, kernel_name: str, kernel_body: str, *args: Any, **kwargs: Any) -> Any:
        # CppScheduling.define_kernel writes its C++ kernels as
        # async_compile.cpp_pybinding(...); openreg's bindings launch them.
        kernel_body = kernel_body.replace("async_compile.cpp_pybinding(", f"{CPP_PYBINDING}(async_compile, ", 1)
        return super().define_kernel(kernel_name, kernel_body, *args, **kwargs)  # type: ignore[misc]

    def make_allocation(
        self, name: str, device: torch.device, dtype: torch.dtype, shape: Any, stride: Any,
        allocation_shape: Any = None, is_pinned: bool = False,
    ) -> str:
        if device.type != "openreg" or torch._inductor.config.test_configs.track_memory_lifecycle:
            return super().make_allocation(  # type: ignore[misc]
                name, device, dtype, shape, stride, allocation_shape, is_pinned
            )
        # For CPU and CUDA buffers PythonWrapperCodegen calls empty_strided_cpu
        # / empty_strided_cuda, which skip torch.empty_strided's argument parser
        # and dispatch; openreg's counterpart is _C._empty_strided. It names the
        # device index: Inductor emits device guards only for GPU types
        # (utils.device_need_guard), so a graph on openreg:1 would otherwise
        # allocate on the current device (-1 when the graph's device has no index).
        shape_code = self.codegen_python_shape_tuple(shape)  # type: ignore[attr-defined]
        allocation_code = self.codegen_python_shape_tuple(allocation_shape or shape)  # type: ignore[attr-defined]
        stride_code = self.codegen_python_shape_tuple(stride)  # type: ignore[attr-defined]
        index = -1 if device.index is None else device.index
        line = f"{name} = {EMPTY_STRIDED}({allocation_code}, {stride_code}, {dtype}, {index})"
        if shape_code != allocation_code:
            line += f".as_strided({shape_code}, {stride_code})"
        return line


class OpenRegSubgraphWrapperCodegen(_OpenRegKernelCalls, SubgraphPythonWrapperCodegen):
    """Subgraphs (torch.cond, while_loop, invoke_subgraph) of an openreg graph."""


class OpenRegWrapperCodegen(_OpenRegKernelCalls, PythonWrapperCodegen):
    """Inductor's Python wrapper, with openreg's C++ kernel calls on CPU aliases."""

    @staticmethod
    def create(
        is_subgraph: bool,
        subgraph_name: str | None,
        parent_wrapper: PythonWrapperCodegen | None,
        partition_signatures: Any = None,
    ) -> PythonWrapperCodegen:
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return OpenRegSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return OpenRegWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        # Subgraphs are functions of this same module and use the name too.
        self.imports.writeline(_IMPORTS)


_CPP_WRAPPER_MESSAGE = (
    "openreg: torch.compile with the C++ wrapper (torch._inductor.config.cpp_wrapper=True, "
    "also used by AOTInductor: torch._inductor.aoti_compile_and_package / aot_compile) is not "
    "supported on openreg with torch 2.13. The C++ wrapper passes tensor data pointers straight "
    "to the kernels, and an openreg data pointer is a device address that CPU code cannot "
    "read; only the Python wrapper routes kernel arguments through openreg's CPU aliases. "
    "Use the default Python wrapper (cpp_wrapper=False), or backend=\"aot_eager\"."
)

_FX_WRAPPER_MESSAGE = (
    "openreg: torch.compile with the FX wrapper (torch._inductor.config.fx_wrapper=True) is "
    "not supported on openreg with torch 2.13: it only launches Triton kernels, and openreg "
    "generates C++ kernels. Use the default Python wrapper (fx_wrapper=False), or "
    "backend=\"aot_eager\"."
)


class OpenRegCppWrapperCodegen(PythonWrapperCodegen):
    """Refuses ``cpp_wrapper=True`` with an explanation.

    Without it, Inductor fails later and obscurely: an assertion that openreg is not
    in ``DEVICE_TO_ATEN``, then a C++ compile error for the missing
    ``torch/csrc/inductor/cpp_wrapper/openreg.h``, and past those the kernels would
    read device addresses.
    """

    supports_caching = False

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> PythonWrapperCodegen:
        raise CppWrapperCodegenError(_CPP_WRAPPER_MESSAGE)


class OpenRegFxWrapperCodegen(PythonWrapperCodegen):
    """Refuses ``fx_wrapper=True`` with an explanation."""

    supports_caching = False

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> PythonWrapperCodegen:
        raise NotImplementedError(_FX_WRAPPER_MESSAGE)


class OpenRegDeviceOpOverrides(DeviceOpOverrides):
    """The device calls the Python wrapper may write, as torch.cuda's are written."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(index):\n    return torch.openreg.current_stream(index).native_handle"

    def set_device(self, device_idx: int) -> str:
        return f"torch.openreg.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.openreg.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.openreg.device({device_idx})"

    def current_stream(self) -> str:
        return "torch.openreg.current_stream()"


# The files whose code decides what Inductor generates for an openreg graph.
_CODEGEN_FILES = (
    __file__,
    _inductor_lowering.__file__,  # the lowering choices
    _fake_tensor.__file__,  # the strides predicted for convolutions, which the wrapper asserts
)


class CodegenVersion(CustomGraphModulePass):
    """Puts openreg's code generation into the key of Inductor's FX graph cache.

    The cache key hashes torch's sources, the graph and the configuration
    (including ``config.cpp.use_two_step_variance_threshold``, which the
    lowering choices read), not an out-of-tree backend's code: without this, a
    wrapper module cached by another version of these files (say one lowered
    LayerNorm with Welford, or predicted a contiguous convolution) would be
    loaded as is. Inductor hashes the ``uuid()`` of each device's registered pass
    (``custom_backend_passes`` in FxGraphHashDetails, which AOTAutograd's cache
    key includes too); in torch 2.13 nothing calls the pass itself.
    """

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        pass

    def uuid(self) -> bytes:
        return get_hash_for_files(_CODEGEN_FILES)


def _count_openreg_nodes_as_cpu_nodes() -> None:
    """Makes the scheduler treat openreg nodes as the C++ backend's nodes.

    Three fusion steps of torch 2.13's Scheduler (loop reordering, reindexing and
    index inversion: ``shared_data_after_reordering_loop``,
    ``_try_reindex_pointwise_for_reduction``, ``shared_data_after_inverting_indexing``)
    assume Triton's node groups unless ``node.is_cpu()``, and fail on C++ groups
    ("can't multiply sequence by non-int of type 'tuple'"). ``is_cpu`` has no other
    caller, and the scheduler offers no per-backend switch, so this extends it to
    openreg, whose nodes are scheduled by the C++ backend too.
    """
    from torch._inductor.scheduler import BaseSchedulerNode

    original = BaseSchedulerNode.is_cpu
    if getattr(original, "_openreg", False):
        return

    def is_cpu(self: BaseSchedulerNode) -> bool:
        device = self.get_device()
        return original(self) or (device is not None and device.type == "openreg")

    is_cpu._openreg = True  # type: ignore[attr-defined]
    BaseSchedulerNode.is_cpu = is_cpu  # type: ignore[method-assign]


def register() -> None:
    """Makes ``openreg`` a device Inductor generates code for."""
    _count_openreg_nodes_as_cpu_nodes()
    _inductor_lowering.register()
    register_device_op_overrides("openreg", OpenRegDeviceOpOverrides())
    register_backend_for_device(
        "openreg",
        OpenRegScheduling,
        OpenRegWrapperCodegen,
        OpenRegCppWrapperCodegen,
        OpenRegFxWrapperCodegen,
        device_custom_pass=CodegenVersion(),
    )
