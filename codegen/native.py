"""Access to torchgen's parsed native_functions.yaml (shipped in the torch wheel)."""

from __future__ import annotations

import functools
import os

import torchgen
from torchgen.api.types import CppSignature, CppSignatureGroup
from torchgen.context import native_function_manager
from torchgen.gen import get_grouped_native_functions, parse_native_yaml, ParsedYaml
from torchgen.model import BackendMetadata, DispatchKey, NativeFunction, NativeFunctionsGroup


def packaged_yaml_dir() -> str:
    return os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")


@functools.lru_cache(maxsize=None)
def parsed() -> ParsedYaml:
    d = packaged_yaml_dir()
    return parse_native_yaml(os.path.join(d, "native_functions.yaml"), os.path.join(d, "tags.yaml"))


@functools.lru_cache(maxsize=None)
def native_functions() -> dict[str, NativeFunction]:
    """Every aten operator by its overload name, e.g. ``"add.Tensor"``."""
    return {str(f.func.name): f for f in parsed().native_functions}


@functools.lru_cache(maxsize=None)
def structured_groups() -> dict[str, NativeFunctionsGroup]:
    """Every structured group by the overload name of its out= operator (``"add.out"``)."""
    return {
        str(g.out.func.name): g
        for g in get_grouped_native_functions(parsed().native_functions)
        if isinstance(g, NativeFunctionsGroup) and g.structured
    }


def cpu_kernel(g: NativeFunctionsGroup) -> BackendMetadata | None:
    """The in-tree CPU kernel of a structured group: its class
    ``{cpp_namespace}::structured_{kernel}`` is exported by libtorch_cpu, and
    its impl() reaches the device through DispatchStubs."""
    return parsed().backend_indices[DispatchKey.CPU].get_kernel(g)


# The keys whose kernels CPU's dispatch table holds, the first one present winning.
_CPU_KEYS = (DispatchKey.CPU, DispatchKey.CompositeExplicitAutograd, DispatchKey.CompositeExplicitAutogradNonFunctional)


def _cpu_key(f: NativeFunction) -> DispatchKey | None:
    indices = parsed().backend_indices
    if f.structured_delegate is not None:
        f = native_functions()[str(f.structured_delegate)]
    return next((k for k in _CPU_KEYS if indices[k].has_kernel(f)), None)


def has_cpu_kernel(f: NativeFunction) -> bool:
    """Whether dispatching ``f`` to CPU reaches a kernel of its own: a CPU
    kernel, its structured out= operator's, or a CompositeExplicitAutograd one
    (which CPU's dispatch table holds too)."""
    return _cpu_key(f) is not None


def cpu_dispatch_namespace(f: NativeFunction) -> str:
    """The namespace of the C++ function that serves ``f`` on CPU, as torch's
    ``ATen/ops/{name}_{namespace}_dispatch.h`` declares it: ``cpu`` or a
    composite one (``compositeexplicitautograd``)."""
    key = _cpu_key(f)
    assert key is not None, f"{f.func.name} has no CPU kernel"
    return str(key).lower()


@functools.lru_cache(maxsize=None)
def nested_kernels_behind_composites() -> tuple[NativeFunction, ...]:
    """Operators with a NestedTensorCPU kernel and a CompositeImplicitAutograd
    one (linear, matmul, narrow, ...). The dispatcher gives the composite to
    every nested backend without a kernel of its own (NestedTensorPrivateUse1
    among them), where it fails or differs from CPU, which runs the nested
    kernel: a backend fallback is never reached for these, so the nested
    fallback is registered for each of them by name."""
    nested_cpu = parsed().backend_indices[DispatchKey.NestedTensorCPU]
    return tuple(
        f
        for f in parsed().native_functions
        if f.has_composite_implicit_autograd_kernel and nested_cpu.has_kernel(f)
    )


@functools.lru_cache(maxsize=None)
def sparse_kernels_behind_composites(compressed: bool) -> tuple[NativeFunction, ...]:
    """Operators with a SparseCPU (``compressed``: SparseCsrCPU) kernel and a
    composite one (``values``, ``is_coalesced``, ``copy_``, ``clone``, ``sum``,
    ...: mostly CompositeExplicitAutograd kernels for dense tensors). The
    dispatcher gives the composite to SparsePrivateUse1 (SparseCsrPrivateUse1),
    where it fails or differs from CPU, which runs the sparse kernel: a
    backend fallback never overrides it, so the sparse fallback is registered
    for each of them by name."""
    sparse_cpu = parsed().backend_indices[DispatchKey.SparseCsrCPU if compressed else DispatchKey.SparseCPU]
    composites = [
        parsed().backend_indices[k]
        for k in (DispatchKey.CompositeExplicitAutograd, DispatchKey.CompositeExplicitAutogradNonFunctional)
    ]
    # The functional and in-place variants of a structured group (mul.Tensor,
    # add_.Tensor, mm) get a generated CompositeExplicitAutogradNonFunctional
    # kernel, whose keys exclude Sparse but not SparseCsr (c10's
    # non_functional_backend_dispatch_keyset, DispatchKeySet.h): they hide the
    # compressed layouts' kernels only.
    return tuple(
        f
        for f in parsed().native_functions
        if sparse_cpu.has_kernel(f)
        and (
            f.has_composite_implicit_autograd_kernel
            or any(c.has_kernel(f) for c in composites)
            or (compressed and f.structured_delegate is not None)
        )
    )


def cpu_function(f: NativeFunction) -> tuple[str, CppSignature]:
    """(namespace, signature) of the C++ function that is CPU's kernel of
    ``f``: ``at::cpu::sum_outf``. The faithful (schema-ordered) and SymInt
    variant, so the dispatcher's arguments pass through unchanged."""
    with native_function_manager(f):
        group = CppSignatureGroup.from_native_function(f, method=False, fallback_binding=f.manual_cpp_binding)
    sig = max(group.signatures(symint=True), key=lambda s: (s.symint, s.faithful))
    return f"at::{cpu_dispatch_namespace(f)}", sig


def cpu_function_name(f: NativeFunction) -> str:
    namespace, sig = cpu_function(f)
    return f"{namespace}::{sig.name()}"
