"""The data model of backend_functions.yaml.

Every entry is a frozen dataclass that keeps the file and line it came from, so
that any later stage can report an error where the user has to fix it. Each
entry knows its `Route`: how openreg serves the operator or stub it names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from codegen.stubs import StubDecl
from torchgen.api import meta
from torchgen.model import BackendMetadata, NativeFunction, NativeFunctionsGroup, OperatorName


class Route(enum.Enum):
    """How openreg serves a call. The one vocabulary of the project: the yaml,
    the generated code, `python -m codegen --list`, `python -m torch_openreg
    info`, the dispatch trace and the profiler name routes by these values, and
    csrc/operators/OpenRegRoutes.h declares the same enum for C++ (a test compares
    the two). docs/adding_an_op.md has the table of what each one costs."""

    # An openreg function with the operator's signature (yaml: kernels).
    kernel = "kernel"
    # torch's meta(), then CPU's impl() on the device tensors; the DispatchStubs
    # impl() calls reach stub routes (yaml: structured).
    structured = "structured"
    # torch's meta(), then an openreg impl() (yaml: structured with `impl`).
    structured_impl = "structured_impl"
    # torch's meta(), then CPU's impl() on CPU aliases of the tensors
    # (yaml: structured with `on_cpu_aliases: true`).
    structured_on_cpu_aliases = "structured_on_cpu_aliases"
    # The operator's CPU kernel on CPU aliases of the tensors (yaml: cpu_kernels).
    cpu_kernel = "cpu_kernel"
    # An openreg function with a DispatchStub's type (yaml: stubs.kernels).
    stub_kernel = "stub_kernel"
    # CPU's kernel of a TensorIterator stub on device memory (yaml: stubs.cpu_kernels).
    stub_cpu_kernel = "stub_cpu_kernel"
    # An operator of the openreg library (yaml: custom_ops).
    custom_op = "custom_op"
    # The boxed CPU fallback (yaml: fallback.global, fallback.ops).
    fallback = "fallback"
    # Raises NotImplementedError with a reason (yaml: fallback.blocklist).
    blocked = "blocked"
    # On nested tensors of the strided layout: the NestedTensorCPU kernel on
    # CPU aliases (yaml: fallback.nested), or refused.
    nested_fallback = "nested_fallback"
    nested_blocked = "nested_blocked"
    # On sparse tensors (COO, CSR, CSC, BSR, BSC): the SparseCPU / SparseCsrCPU
    # kernel on CPU aliases of their indices and values (yaml: fallback.sparse),
    # or refused.
    sparse_fallback = "sparse_fallback"
    sparse_blocked = "sparse_blocked"


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
    route: Route = Route.kernel

    @property
    def name(self) -> OperatorName:
        return self.func.func.name


@dataclass(frozen=True)
class CpuKernelEntry:
    """An aten operator whose own CPU kernel runs on CPU aliases of the openreg
    operands; its results come back as openreg tensors."""

    func: NativeFunction
    # CPU tensors of any shape are accepted beside openreg ones (fallback.cpu_tensor_args).
    accepts_cpu_tensors: bool
    loc: Location
    route: Route = Route.cpu_kernel

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
    # NestedTensorCPU kernels on CPU aliases; otherwise every operator on them
    # raises. Only with `enabled` (load.py checks).
    nested: bool = True
    # Sparse tensors (SparsePrivateUse1, SparseCsrPrivateUse1) run torch's
    # SparseCPU / SparseCsrCPU kernels on CPU aliases of their indices and
    # values; otherwise every operator on them raises. Only with `enabled`.
    sparse: bool = True
    # Operators whose results torch keeps on the CPU for every device (the
    # metadata of nested tensors): their fresh results stay CPU tensors.
    cpu_results: tuple[OpRef, ...] = ()
    # With `nested`: operators whose NestedTensorCPU kernel a
    # CompositeImplicitAutograd kernel would hide from the nested fallback
    # (derived from native_functions.yaml, never written in the yaml).
    nested_ops: tuple[NativeFunction, ...] = ()
    # With `sparse`: operators whose SparseCPU / SparseCsrCPU kernel a
    # composite kernel would hide from the sparse fallback (derived from
    # native_functions.yaml, less the blocklist).
    sparse_ops: tuple[NativeFunction, ...] = ()
    sparse_compressed_ops: tuple[NativeFunction, ...] = ()


@dataclass(frozen=True)
class StructuredEntry:
    """A structured group: torch's meta() checks the arguments and asks for the
    output, and impl() computes it (Route says whose impl() and on what)."""

    group: NativeFunctionsGroup
    cpu_kernel: BackendMetadata | None  # names the exported class {cpp_namespace}::structured_{kernel}
    loc: Location
    route: Route
    impl: str | None = None  # with Route.structured_impl: a function in BackendConfig.cpp_namespace

    def __post_init__(self) -> None:
        assert self.route in (Route.structured, Route.structured_impl, Route.structured_on_cpu_aliases)
        assert (self.impl is not None) == (self.route is Route.structured_impl)
        assert self.impl is not None or self.cpu_kernel is not None

    @property
    def name(self) -> OperatorName:
        return self.group.out.func.name

    @property
    def parent_class(self) -> str:
        """The class the generated ones derive from: torch's meta class for an
        openreg impl(), CPU's structured class (meta() and impl()) otherwise."""
        if self.impl is not None:
            return f"at::meta::structured_{meta.name(self.group)}"
        assert self.cpu_kernel is not None
        return f"{self.cpu_kernel.cpp_namespace}::structured_{self.cpu_kernel.kernel}"

    def serving(self, namespace: str) -> str:
        """The function that computes the result, for traces and the route table."""
        return f"{namespace}::{self.impl}" if self.impl is not None else self.parent_class

    def functions(self) -> tuple[NativeFunction, ...]:
        """The out=, functional and in-place operators, each given a wrapper."""
        return tuple(self.group.functions())


@dataclass(frozen=True)
class StubEntry:
    """A DispatchStub with a PrivateUse1 kernel: an openreg function
    (Route.stub_kernel, named in the yaml) or CPU's kernel of the stub on
    device memory (Route.stub_cpu_kernel, derived from torch's headers)."""

    decl: StubDecl
    kernel: str | None  # with Route.stub_kernel: a function in BackendConfig.cpp_namespace
    loc: Location
    route: Route

    def __post_init__(self) -> None:
        assert self.route in (Route.stub_kernel, Route.stub_cpu_kernel)
        assert (self.kernel is not None) == (self.route is Route.stub_kernel)


@dataclass(frozen=True)
class CustomOp:
    """An operator in the `openreg` namespace, declared by its schema."""

    func: NativeFunction  # parsed by torchgen from the schema
    kernel: str  # PrivateUse1 kernel in cpp_namespace
    meta: str  # Meta kernel in cpp_namespace: shapes and dtypes only, for FakeTensor
    backward: str | None  # name of the custom op computing its input gradients
    loc: Location
    route: Route = Route.custom_op

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
    # Every stub with a PrivateUse1 kernel: the yaml's stubs.kernels, then the
    # derived stub_cpu_kernel ones.
    stubs: tuple[StubEntry, ...] = ()
    custom_ops: tuple[CustomOp, ...] = ()
    custom_namespace: str = "openreg"
    cpu_kernels: tuple[CpuKernelEntry, ...] = ()

    def custom_op(self, name: str) -> CustomOp | None:
        return next((c for c in self.custom_ops if str(c.name) == name), None)
