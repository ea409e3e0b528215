"""Inductor code generation for openreg: torch's C++ CPU kernels, run on CPU aliases.

An openreg kernel is a CPU kernel run on device memory (docs/architecture.md), so
Inductor's C++ backend (``CppScheduling``: vectorised, OpenMP-parallel loops) already
writes the right kernels for openreg. What differs is how they are called. Inductor's
Python wrapper calls a C++ kernel with the tensors themselves, and the binding glue
that ``CppPythonBindingsCodeCache`` compiles around it reads ``data_ptr()``, which for
an openreg tensor is a device-view address CPU code must not touch
(docs/runtime.md). ``OpenRegWrapperCodegen`` therefore emits each C++ kernel call as

    cpp_fused_add_relu_0(*openreg_host_aliases((arg0_1, buf0, 8)))

``torch_openreg._C._host_aliases`` replaces every openreg tensor by a CPU tensor over
the same bytes at their kernel-view address (other arguments pass through) after
joining the current stream of each device involved, so the kernel runs after the
copies queued before it, exactly where an eager openreg kernel would. Everything else
in the wrapper already works on openreg tensors. Buffers come from the openreg caching
allocator through ``torch_openreg._C._empty_strided``, the counterpart of the
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

from typing import Any

import torch
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.exc import CppWrapperCodegenError
from torch._inductor.virtualized import V

from torch_openreg.openreg import _fake_tensor, _inductor_lowering

# The names the generated module calls; imported in its header.
HOST_ALIASES = "openreg_host_aliases"
EMPTY_STRIDED = "empty_strided_openreg"
_IMPORTS = f"from torch_openreg._C import _host_aliases as {HOST_ALIASES}, _empty_strided as {EMPTY_STRIDED}"


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
        # OpenRegScheduling), and CPU aliases pass CPU tensors through. The
        # trailing comma keeps a one-argument tuple a tuple.
        args = ", ".join(call_args)
        self.writeline(f"{kernel_name}(*{HOST_ALIASES}(({args},))){self.ending}")  # type: ignore[attr-defined]

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
