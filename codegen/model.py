"""The data model of backend_functions.yaml.

Every entry is a frozen dataclass that keeps the file and line it came from, so
that any later stage can report an error where the user has to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchgen.model import NativeFunction, OperatorName


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


@dataclass(frozen=True)
class BackendConfig:
    source: str  # the yaml path as given, named in generated headers
    cpp_namespace: str
    kernels: tuple[KernelEntry, ...]
    fallback: FallbackPolicy

    def binding_of(self) -> dict[str, str]:
        """How each operator named in the yaml is bound, for --list."""
        bound: dict[str, str] = {}
        for k in self.kernels:
            bound[str(k.name)] = f"wrapper -> {self.cpp_namespace}::{k.kernel}"
        for r in self.fallback.ops:
            bound[str(r.name)] = "fallback (per operator)"
        for r in self.fallback.blocklist:
            bound[str(r.name)] = f"blocked: {r.reason}"
        return bound
