"""Inductor code generation for openreg: torch's C++ CPU kernels, launched on the stream.

An openreg kernel is a CPU kernel run on device memory (docs/integration/operators.md,
"CPU aliases"), so Inductor's C++ backend (``CppScheduling``: vectorised,
OpenMP-parallel loops) already writes the right kernels for openreg. What differs
is how they are called. Inductor's Python wrapper calls a C++ kernel with the
tensors themselves, and the binding glue that ``CppPythonBindingsCodeCache``
compiles around it reads ``data_ptr()``, which for an openreg tensor is a
device-view address CPU code must not touch (docs/integration/device.md).
``OpenRegWrapperCodegen`` therefore emits each C++ kernel call as

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

The C++ wrapper (``cpp_wrapper=True``, also used by AOTInductor) is
``OpenRegCppWrapperCodegen`` (docs/integration/compiler.md); the FX wrapper (``fx_wrapper=True``) is
refused with an explanation.
"""

from __future__ import annotations

import os
import re
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
from torch._inductor.codegen.cpp_utils import DEVICE_TO_ATEN
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
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


_FX_WRAPPER_MESSAGE = (
    "openreg: torch.compile with the FX wrapper (torch._inductor.config.fx_wrapper=True) is "
    "not supported on openreg with torch 2.13: it only launches Triton kernels, and openreg "
    "generates C++ kernels. Use the default Python wrapper (fx_wrapper=False), or "
    "backend=\"aot_eager\"."
)


# Included by the C++ wrapper after torch's CPU header (get_device_include_path_jit):
# how the wrapper reaches openreg. Its C++ kernels are called through
# openreg_inductor::launch, and its extern kernels through openreg's C shims
# (aoti_torch_openreg_<op>, defined with OPENREG_C_SHIM by the wrapper as it uses
# them); both are found by name with openreg_inductor_function
# (csrc/compiler/OpenRegInductorLaunch.h). The wrapper is built without openreg's
# headers or library: a program that linked torch_openreg._C has that function in
# its global scope (dlsym), and in Python, which loads _C privately, its address
# travels through the environment, as for the Python wrapper's bindings
# (_LAUNCH_ENV); register() sets it.
_FUNCTIONS_ENV = "_OPENREG_INDUCTOR_FUNCTIONS"
_CPP_WRAPPER_LAUNCH = """
// openreg (torch_openreg/openreg/_inductor.py): a C++ kernel is called with the
// kernel addresses of its openreg tensors and queued on the current stream of
// their device, like an eager openreg kernel (csrc/compiler/OpenRegInductorLaunch.h).
#include <dlfcn.h>
#include <array>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
namespace openreg_inductor {
typedef void* (*function_lookup)(const char*);
typedef void (*closure_fn)(void*);
typedef void (*launch_fn)(closure_fn, void*, closure_fn);
typedef const char* (*kernel_pointers_fn)(const char*, void* const*, int64_t, void**);
template <typename F>
static F function(const char* name) {
    static const function_lookup lookup = [] {
        if (void* found = dlsym(RTLD_DEFAULT, "openreg_inductor_function")) {
            return reinterpret_cast<function_lookup>(found);
        }
        const char* address = std::getenv("%(env)s");
        if (address == nullptr) {
            throw std::runtime_error(
                "openreg: import torch_openreg (or link torch_openreg's _C library) before running code "
                "compiled for openreg");
        }
        return reinterpret_cast<function_lookup>(std::strtoull(address, nullptr, 10));
    }();
    void* found = lookup(name);
    if (found == nullptr) {
        throw std::runtime_error(
            std::string("openreg: torch_openreg._C has no ") + name +
            " (an operator without an openreg C shim, docs/integration/compiler.md, or a torch_openreg older than this code)");
    }
    return reinterpret_cast<F>(found);
}
// body(p) calls the kernel with p[i], the kernel address of tensors[i]; `name` is a literal.
template <size_t N, typename F>
static void launch(const char* name, const std::array<AtenTensorHandle, N>& tensors, F body) {
    static const kernel_pointers_fn kernel_pointers = function<kernel_pointers_fn>("openreg_inductor_kernel_pointers");
    static const launch_fn launch_host_kernel = function<launch_fn>("openreg_launch_host_kernel");
    struct Closure {
        std::array<void*, N> pointers;
        F body;
        static void run(void* self) {
            Closure* closure = static_cast<Closure*>(self);
            closure->body(closure->pointers.data());
        }
        static void release(void* self) {
            delete static_cast<Closure*>(self);
        }
    };
    Closure* closure = new Closure{{}, std::move(body)};
    const char* error = kernel_pointers(
        name, reinterpret_cast<void* const*>(tensors.data()), static_cast<int64_t>(N), closure->pointers.data());
    if (error != nullptr) {
        delete closure;
        throw std::runtime_error(error);
    }
    launch_host_kernel(&Closure::run, closure, &Closure::release);
}
// AOTInductor models: torch 2.13 cannot make a model's constants openreg tensors
// (aoti_torch_create_tensor_from_blob_v2 returns no tensor for PrivateUse1, and
// AOTInductorModelBase::load_constants keeps non-CUDA constants in host memory),
// so the model loads them as CPU tensors and its first run replaces each by an
// openreg copy in the model's constant map (OpenRegCppWrapperCodegen).
template <typename ConstantMap, typename Constants, typename NameOf>
static void constants_to_device(ConstantMap& map, Constants& constants, NameOf name_of, int32_t device_index) {
    static std::mutex* mutex = new std::mutex;
    const int32_t openreg = aoti_torch_device_type_privateuse1();
    std::lock_guard<std::mutex> lock(*mutex);
    for (size_t i = 0; i < constants.size(); ++i) {
        AtenTensorHandle constant = constants[i];
        if (constant == nullptr) {
            continue;
        }
        int32_t device_type = 0;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(constant, &device_type));
        if (device_type == openreg) {
            continue;
        }
        int64_t ndim = 0;
        int64_t* sizes = nullptr;
        int64_t* strides = nullptr;
        int32_t dtype = 0;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dim(constant, &ndim));
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_sizes(constant, &sizes));
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_strides(constant, &strides));
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(constant, &dtype));
        AtenTensorHandle copy = nullptr;
        AOTI_TORCH_ERROR_CODE_CHECK(
            aoti_torch_empty_strided(ndim, sizes, strides, dtype, openreg, device_index, &copy));
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_copy_(copy, constant, 0));
        auto entry = map.find(name_of(i));
        if (entry == map.end()) {
            AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_delete_tensor_object(copy));
            throw std::runtime_error(std::string("openreg: constant ") + name_of(i) + " is not in the model's constant map");
        }
        entry->second = torch::aot_inductor::RAIIAtenTensorHandle(copy);  // frees the CPU tensor
        constants[i] = torch::aot_inductor::ConstantHandle(copy);
    }
}
} // namespace openreg_inductor
// aoti_torch_openreg_<op>, with the signature of torch's CPU shim of the operator.
#define OPENREG_C_SHIM(op)                                                          \\
    ([]() {                                                                         \\
        static const auto shim =                                                    \\
            openreg_inductor::function<decltype(&aoti_torch_cpu_##op)>("aoti_torch_openreg_" #op); \\
        return shim;                                                                \\
    }())
""" % {"env": _FUNCTIONS_ENV}


class OpenRegCppWrapperCodegen(CppWrapperCpu):
    """Inductor's C++ wrapper for openreg graphs: ``cpp_wrapper=True``, and the
    models of AOTInductor packages (docs/integration/compiler.md).

    Torch's CPU C++ wrapper with these changes. Buffers are allocated on openreg
    (``aoti_torch_empty_strided`` with PrivateUse1's device type, which
    ``register`` adds to ``DEVICE_TO_ATEN``). Each C++ kernel is called through
    ``openreg_inductor::launch`` (``_CPP_WRAPPER_LAUNCH``) instead of with
    ``data_ptr()``s: openreg hands it the kernel addresses of its tensors and
    queues it on the stream, as the Python wrapper's bindings do. Extern
    kernels call openreg's C shims (``get_c_shim_func_name``). An AOTInductor
    model is made an openreg model (``codegen_model_constructor``) whose
    constants move to the device at its first run (``_write_constants_unpacking``).
    """

    @staticmethod
    def create(
        is_subgraph: bool,
        subgraph_name: str | None,
        parent_wrapper: PythonWrapperCodegen | None,
        partition_signatures: Any = None,
    ) -> PythonWrapperCodegen:
        return OpenRegCppWrapperCodegen()

    @staticmethod
    def get_device_include_path_jit(device: str) -> str:
        if device != "openreg":
            return CppWrapperCpu.get_device_include_path_jit(device)
        return CppWrapperCpu.get_device_include_path_jit("cpu") + "\n" + _CPP_WRAPPER_LAUNCH

    @staticmethod
    def get_device_include_path_aot(device: str) -> str:
        if device != "openreg":
            return CppWrapperCpu.get_device_include_path_aot(device)
        return CppWrapperCpu.get_device_include_path_aot("cpu") + "\n" + _CPP_WRAPPER_LAUNCH

    def codegen_model_constructor(self) -> None:
        # The constructor's check of the constants' device compares them with
        # self.device, the CPU (which elsewhere picks the CPU's compile options).
        self.device = "openreg"
        try:
            super().codegen_model_constructor()
        finally:
            self.device = "cpu"
        # AOTInductorModelBase's constructor parsed the device string, which
        # accepts only torch's own devices (parse_device_str in
        # torch/csrc/inductor/aoti_runtime/model_base.h): openreg's runner
        # (csrc/compiler/OpenRegAotiRunner.cpp) passes "cpu:<index>", and the model
        # is an openreg model from here on (its device type is what the
        # runner and the constant-update APIs see).
        closing = self.prefix._lines.pop()
        assert closing == "}", closing
        # Its constants are loaded as CPU tensors, which the first run copies
        # to the device (constants_to_device in _CPP_WRAPPER_LAUNCH).
        for i, line in enumerate(self.prefix._lines):
            if isinstance(line, str) and re.fullmatch(r"\s*constants_info_\[\d+\]\.device_type = cached_torch_device_type_privateuse1;", line):
                self.prefix._lines[i] = line.replace("cached_torch_device_type_privateuse1", "aoti_torch_device_type_cpu()")
        with self.prefix.indent():
            self.prefix.writeline("device_type_ = aoti_torch_device_type_privateuse1();")
            # No index in the device string: openreg:0, as an openreg tensor
            # made without an index is (the runner names the index it was given).
            self.prefix.writeline("if (device_idx_ < 0) { device_idx_ = 0; }")
        self.prefix.writeline(closing)

    def __init__(self) -> None:
        super().__init__()
        self._openreg_c_shims: set[str] = set()

    def get_c_shim_func_name(self, kernel: str, device: str) -> str:  # type: ignore[override]
        # An extern kernel of an openreg graph: torch's name for the shim of
        # a device, defined here on first use (OPENREG_C_SHIM).
        name = CppWrapperCpu.get_c_shim_func_name(kernel, device)
        prefix = "aoti_torch_openreg_"
        if name.startswith(prefix) and name not in self._openreg_c_shims:
            self._openreg_c_shims.add(name)
            self.header.writeline(f"#define {name} OPENREG_C_SHIM({name.removeprefix(prefix)})")
        return name

    def _write_constants_unpacking(self) -> None:
        if V.graph.constants:
            self.prefix.writeline_aot(
                "openreg_inductor::constants_to_device(*constants_map_, *constants_, "
                "[this](size_t i) { return std::string(this->constant_name(static_cast<int64_t>(i))); }, "
                "this->device_idx_);"
            )
        super()._write_constants_unpacking()

    def _generate_kernel_call_helper(
        self, kernel_name: str, call_args: list[str], *, device: Any = None, triton: bool = True,
        arg_types: Any = None, **kwargs: Any,
    ) -> None:
        if triton or arg_types is None:
            return super()._generate_kernel_call_helper(
                kernel_name, call_args, device=device, triton=triton, arg_types=arg_types, **kwargs
            )
        # As CppWrapperCpu does, a pointer argument is a tensor handle (it passes
        # `(float*)(buf0.data_ptr())`); here its address comes from openreg.
        tensors: list[str] = []
        args: list[str] = []
        for arg, arg_type in zip(call_args, arg_types):
            if isinstance(arg_type, str) and "*" in arg_type:
                args.append(f"({arg_type})(p[{len(tensors)}])")
                tensors.append(f"{arg}.get()")
            else:
                args.append(str(arg))
        self.writeline(
            f"openreg_inductor::launch<{len(tensors)}>(\"{kernel_name}\", {{{', '.join(tensors)}}}, "
            f"[=](void* const* p) {{ {kernel_name}({', '.join(args)}); }});"
        )


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


def _precompile_the_cpu_header_for_openreg() -> None:
    """AOTInductor precompiles the wrapper's device header before building a
    model (``config.aot_inductor.precompile_headers``), named after the device
    (``codecache._get_cpp_wrapper_header``: torch/csrc/inductor/aoti_include/<device>.h),
    which torch has for its own devices only. openreg's wrapper includes the
    CPU's header (``OpenRegCppWrapperCodegen.get_device_include_path_aot``), so
    the CPU's is the one to precompile."""
    from torch._inductor import codecache

    original = codecache._get_cpp_wrapper_header
    if getattr(original, "_openreg", False):
        return

    def _get_cpp_wrapper_header(device: str, aot_mode: bool = False) -> str:
        if device.split(":", maxsplit=1)[0] == "openreg":
            device = "cpu"
        return original(device, aot_mode)

    _get_cpp_wrapper_header._openreg = True  # type: ignore[attr-defined]
    codecache._get_cpp_wrapper_header = _get_cpp_wrapper_header


def register() -> None:
    """Makes ``openreg`` a device Inductor generates code for."""
    _count_openreg_nodes_as_cpu_nodes()
    _precompile_the_cpu_header_for_openreg()
    _inductor_lowering.register()
    register_device_op_overrides("openreg", OpenRegDeviceOpOverrides())
    # The C++ wrapper names a device by its ATen type (CppWrapperCpu.codegen_device):
    # at::kPrivateUse1 becomes aoti_torch_device_type_privateuse1() in its allocations.
    DEVICE_TO_ATEN.setdefault("openreg", "at::kPrivateUse1")
    os.environ[_LAUNCH_ENV] = str(_C._launch_host_kernel_address())
    os.environ[_FUNCTIONS_ENV] = str(_C._inductor_function_address())
    register_backend_for_device(
        "openreg",
        OpenRegScheduling,
        OpenRegWrapperCodegen,
        OpenRegCppWrapperCodegen,
        OpenRegFxWrapperCodegen,
        device_custom_pass=CodegenVersion(),
    )
