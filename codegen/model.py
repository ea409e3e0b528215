"""The data model of backend_functions.yaml.

Every entry is a frozen dataclass that keeps the file and line it came from, so
that any later stage can report an error where the user has to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass

from codegen.stubs import StubDecl
from torchgen.api import meta
from torchgen.model import BackendMetadata, NativeFunction, NativeFunctionsGroup, OperatorName


# The generated header that declares every kernel the yaml names.
NATIVE_HEADER = "OpenRegNativeFunctions.h"
# For `cpu_kernel: true` stubs: the hand-written header (under csrc/) and the
# class template in cpp_namespace whose `run` calls a stub's CPU kernel.
CPU_KERNEL_HEADER = "aten/native/CpuIterator.h"
CPU_KERNEL_TEMPLATE = "CpuKernelOf"
# Called between a structured op's meta() and impl(), with the op object
# (declared in CPU_KERNEL_HEADER, in the backend's cpp_namespace).
STRUCTURED_PREPARE = "prepare_structured_impl"
# Every generated kernel entry point opens a trace scope (csrc/aten/OpenRegTrace.h):
# the dispatch trace and the profiler observe calls through it.
TRACE_HEADER = "aten/OpenRegTrace.h"
# openreg::OptionalDeviceGuard, the generated wrappers' device guard.
DEVICE_HEADER = "aten/OpenRegDevice.h"
# What a structured class does when meta() asks for an output (allocate,
# resize, check, proxy): set_new_output and set_given_output.
STRUCTURED_HEADER = "aten/OpenRegStructured.h"
STRUCTURED_NAMESPACE = "::openreg::structured"
TRACE_NAMESPACE = "::openreg::trace"


def trace_scope(op: str, route: str, kernel: str) -> str:
    """The statement that opens the trace scope of one call; `route` names a
    value of openreg::trace::Route."""
    return f'const {TRACE_NAMESPACE}::Scope trace_scope("{op}", {TRACE_NAMESPACE}::Route::{route}, "{kernel}");'


def common_device_checks(op: str, tensors: list[str]) -> list[str]:
    """The statements torchgen writes for in-tree backends to check that the
    named tensor arguments are all on one device
    (c10::impl::check_and_update_common_device); `op` names the operator in
    the error."""
    return ["std::optional<c10::Device> common_device;"] + [
        f'c10::impl::check_and_update_common_device(common_device, {a}, "{op}", "{a}");' for a in tensors
    ]


def wrapper_name(op: object) -> str:
    """The generated wrapper of an aten operator: add.out -> wrapper_add_out."""
    return "wrapper_" + str(op).replace(".", "_")


def aten_registrations(wrappers: str, impls: str) -> str:
    """Wrappers in an anonymous namespace and their PrivateUse1 registrations,
    inside `namespace at` (which the caller closes)."""
    return f"""namespace at {{
namespace {{

{wrappers}

}} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {{
{impls}
}}
"""


@dataclass(frozen=True)
class Location:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class YamlError(Exception):
    """A mistake in backend_functions.yaml: where it is, what is wrong, what to do."""

    def __init__(self, loc: Location, message: str) -> None:
        super().__init__(f"{loc}: {message}")
        self.loc = loc
        self.message = message


@dataclass(frozen=True)
class KernelEntry:
    """An aten operator served by a hand-written openreg kernel."""

    func: NativeFunction
    kernel: str  # function name inside BackendConfig.cpp_namespace
    symint: bool  # the kernel takes SymInt (c10::SymIntArrayRef) rather than int
    device_guard: bool
    device_check: bool
    # The kernel resolves conjugate/negative bits itself, so the Conjugate and
    # Negative keys fall through to it instead of materialising its inputs.
    handles_conj_neg: bool
    # The kernel is the operator's autograd kernel for openreg (registered under
    # AutogradPrivateUse1): for a CompositeImplicitAutograd operator that openreg
    # serves another way than torch's composite; autograd records the graph of
    # the operators the kernel calls.
    autograd: bool
    loc: Location

    @property
    def name(self) -> OperatorName:
        return self.func.func.name


@dataclass(frozen=True)
class CpuKernelEntry:
    """An aten operator whose own CPU kernel runs on the device memory: the
    generated wrapper hands it host aliases of the openreg operands
    (csrc/aten/OpenRegCpuKernelCall.h) and returns its results as openreg tensors."""

    func: NativeFunction
    # CPU tensors of any shape are accepted beside openreg ones (fallback.cpu_tensor_args).
    accepts_cpu_tensors: bool
    loc: Location

    @property
    def name(self) -> OperatorName:
        return self.func.func.name


@dataclass(frozen=True)
class OpRef:
    """An operator named in the fallback section, with an optional reason."""

    func: NativeFunction
    loc: Location
    reason: str | None = None

    @property
    def name(self) -> OperatorName:
        return self.func.func.name


@dataclass(frozen=True)
class FallbackPolicy:
    enabled: bool  # register the boxed CPU fallback for every operator
    ops: tuple[OpRef, ...]  # per-operator fallback (useful when enabled is false)
    blocklist: tuple[OpRef, ...]  # operators that raise instead of falling back
    cpu_tensor_args: tuple[OpRef, ...]  # operators that accept CPU tensors of any shape
    # Nested tensors of the strided layout (NestedTensorPrivateUse1) run torch's
    # NestedTensorCPU kernels on host aliases; otherwise every operator on them
    # raises. Only with `enabled` (load.py checks).
    nested: bool = True
    # Operators whose results torch keeps on the CPU for every device (the
    # metadata of nested tensors): their fresh results stay CPU tensors.
    cpu_results: tuple[OpRef, ...] = ()
    # With `nested`: operators whose NestedTensorCPU kernel a
    # CompositeImplicitAutograd kernel would hide from the nested fallback
    # (derived from native_functions.yaml, never written in the yaml).
    nested_ops: tuple[NativeFunction, ...] = ()


@dataclass(frozen=True)
class StructuredEntry:
    """A structured group: torch's meta() checks the arguments and asks for the
    output, and impl() computes it. impl() is either torch's own structured CPU
    class (whose DispatchStubs reach openreg kernels) or, with `impl`, an openreg
    function taking the impl() arguments, for an operator whose CPU impl reads
    memory itself instead of through a stub (as CUDA has its own impl). With
    `host_impl`, torch's CPU impl() runs on host aliases of the tensors, for an
    impl that calls its CPU kernel with kCPU or a stub taking tensors."""

    group: NativeFunctionsGroup
    cpu_kernel: BackendMetadata | None  # names the exported class {cpp_namespace}::structured_{kernel}
    loc: Location
    impl: str | None = None  # function in BackendConfig.cpp_namespace
    host_impl: bool = False  # CPU's impl() runs on host aliases of the tensor arguments

    @property
    def name(self) -> OperatorName:
        return self.group.out.func.name

    @property
    def parent_class(self) -> str:
        if self.impl is not None:
            return f"at::meta::structured_{meta.name(self.group)}"
        assert self.cpu_kernel is not None
        return f"{self.cpu_kernel.cpp_namespace}::structured_{self.cpu_kernel.kernel}"

    @property
    def stem(self) -> str:
        """What the generated classes are named after."""
        if self.impl is not None:
            return self.impl
        assert self.cpu_kernel is not None
        return self.cpu_kernel.kernel

    def serving(self, namespace: str) -> str:
        """The function that computes the result, for traces and bindings()."""
        if self.impl is not None:
            return f"{namespace}::{self.impl}"
        return f"{self.parent_class} on host aliases" if self.host_impl else self.parent_class

    def functions(self) -> tuple[NativeFunction, ...]:
        """The out=, functional and in-place operators, each given a wrapper."""
        return tuple(self.group.functions())


@dataclass(frozen=True)
class StubEntry:
    """A DispatchStub whose PrivateUse1 entry is an openreg kernel."""

    decl: StubDecl
    kernel: str | None  # function name inside BackendConfig.cpp_namespace
    loc: Location
    # No hand-written kernel: run torch's CPU kernel of the same stub on the
    # device memory (CPU_KERNEL_TEMPLATE in CPU_KERNEL_HEADER).
    cpu_kernel: bool = False


@dataclass(frozen=True)
class CustomOp:
    """An operator in the `openreg` namespace, declared by its schema."""

    func: NativeFunction  # parsed by torchgen from the schema
    kernel: str  # PrivateUse1 kernel in cpp_namespace
    meta: str  # Meta kernel in cpp_namespace: shapes and dtypes only, for FakeTensor
    backward: str | None  # name of the custom op computing its input gradients
    loc: Location

    @property
    def name(self) -> OperatorName:
        return self.func.func.name


@dataclass(frozen=True)
class BackendConfig:
    source: str  # the yaml path as given, named in generated headers
    cpp_namespace: str
    kernels: tuple[KernelEntry, ...]
    fallback: FallbackPolicy
    structured: tuple[StructuredEntry, ...] = ()
    stubs: tuple[StubEntry, ...] = ()
    custom_ops: tuple[CustomOp, ...] = ()
    custom_namespace: str = "openreg"
    cpu_kernels: tuple[CpuKernelEntry, ...] = ()

    def custom_op(self, name: str) -> CustomOp | None:
        return next((c for c in self.custom_ops if str(c.name) == name), None)

    def binding_of(self) -> dict[str, str]:
        """How each operator named in the yaml is bound, for --list."""
        bound: dict[str, str] = {}
        for k in self.kernels:
            bound[str(k.name)] = f"wrapper -> {self.cpp_namespace}::{k.kernel}"
        for s in self.structured:
            for f in s.functions():
                bound[str(f.func.name)] = f"structured ({s.serving(self.cpp_namespace)}, {f.func.kind().name})"
        for c in self.cpu_kernels:
            bound[str(c.name)] = "cpu kernel -> torch's CPU kernel on device memory"
        for st in self.stubs:
            target = "torch's CPU kernel on device memory" if st.cpu_kernel else f"{self.cpp_namespace}::{st.kernel}"
            bound[f"stub {st.decl.qualified_name}"] = f"stub -> {target}"
        for c in self.custom_ops:
            autograd = f"backward {self.custom_namespace}::{c.backward}" if c.backward else "no derivative"
            bound[f"{self.custom_namespace}::{c.name}"] = (
                f"custom -> {self.cpp_namespace}::{c.kernel} (meta {c.meta}, {autograd})"
            )
        for r in self.fallback.ops:
            bound[str(r.name)] = "fallback (per operator)"
        for r in self.fallback.blocklist:
            bound[str(r.name)] = f"blocked: {r.reason}"
        for f in self.fallback.nested_ops:
            bound[f"nested {f.func.name}"] = (
                "nested CPU fallback, registered by name (its CompositeImplicitAutograd kernel would hide "
                "its NestedTensorCPU kernel)"
            )
        return bound
