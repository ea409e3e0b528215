"""RegisterRoutes.cpp: the fallbacks the yaml turns on, and the route table
(every binding, and the fallback's per-operator lists) registered with
csrc/operators/OpenRegRoutes.h, so that code below the generated files reads the
yaml's decisions without calling up into them."""

from __future__ import annotations

from dataclasses import dataclass

from codegen import cpp
from codegen.emit.stubs import stub_kernel
from codegen.model import BackendConfig, OpRef, Route
from codegen.native import cpu_function_name

FILE = "RegisterRoutes.cpp"
BOXED_FALLBACK = "::openreg::cpu_fallback"
BOXED_NESTED_FALLBACK = "::openreg::nested_fallback"
BOXED_REFUSE_NESTED = "::openreg::refuse_nested"
BOXED_SPARSE_FALLBACK = "::openreg::sparse_fallback"
BOXED_SPARSE_COMPRESSED_FALLBACK = "::openreg::sparse_compressed_fallback"
BOXED_REFUSE_SPARSE = "::openreg::refuse_sparse"
BOXED_BLOCKED = "::openreg::blocked_kernel"


@dataclass(frozen=True)
class Binding:
    """One row of the route table."""

    name: str  # "aten::add.out", "openreg::add_relu", "at::native::add_stub"
    route: Route
    detail: str  # the function that serves it, or a blocked operator's reason


def bindings(cfg: BackendConfig) -> list[Binding]:
    """Every operator and stub the yaml binds (stub_cpu_kernel ones derived), with its route."""
    ns = cfg.cpp_namespace
    rows = [Binding(f"aten::{k.name}", k.route, f"{ns}::{k.kernel}") for k in cfg.kernels]
    rows += [Binding(f"aten::{f.func.name}", s.route, s.serving(ns)) for s in cfg.structured for f in s.functions()]
    rows += [Binding(f"aten::{c.name}", c.route, cpu_function_name(c.func)) for c in cfg.cpu_kernels]
    rows += [Binding(f"{cfg.custom_namespace}::{c.name}", c.route, f"{ns}::{c.kernel}") for c in cfg.custom_ops]
    rows += [Binding(st.decl.qualified_name, st.route, stub_kernel(cfg, st).removeprefix("::")) for st in cfg.stubs]
    rows += [Binding(f"aten::{r.name}", Route.fallback, "") for r in cfg.fallback.ops]
    rows += [Binding(f"aten::{r.name}", Route.blocked, r.reason or "") for r in cfg.fallback.blocklist]
    return rows


def _boxed(function: str) -> str:
    return f"torch::CppFunction::makeFromBoxedFunction<&{function}>()"


def registrations(cfg: BackendConfig) -> list[str]:
    policy = cfg.fallback
    blocks = []
    if policy.enabled:
        blocks.append(
            cpp.library_block(
                "PrivateUse1",
                [f"m.fallback({_boxed(BOXED_FALLBACK)});"],
                "// Every operator without an openreg kernel runs through the CPU fallback.",
                namespace="_",
            )
        )
        if policy.nested:
            blocks.append(
                cpp.library_block(
                    "NestedTensorPrivateUse1",
                    [f"m.fallback({_boxed(BOXED_NESTED_FALLBACK)});"],
                    "// Nested tensors of the strided layout have a dispatch key of their own: every\n"
                    "// operator on them runs its NestedTensorCPU kernel on CPU aliases of the\n"
                    "// device memory (fallback.nested).",
                    namespace="_",
                )
            )
            if policy.nested_ops:
                blocks.append(
                    cpp.library_block(
                        "NestedTensorPrivateUse1",
                        [cpp.impl_line(f.func.name, _boxed(BOXED_NESTED_FALLBACK)) for f in policy.nested_ops],
                        "// Operators with a NestedTensorCPU kernel and a CompositeImplicitAutograd one:\n"
                        "// the dispatcher gives NestedTensorPrivateUse1 the composite, which the\n"
                        "// fallback above never overrides, so the fallback is registered by name.",
                    )
                )
        else:
            blocks.append(
                cpp.library_block(
                    "NestedTensorPrivateUse1",
                    [f"m.fallback({_boxed(BOXED_REFUSE_NESTED)});"],
                    "// Nested tensors of the strided layout have a dispatch key of their own, and\n"
                    "// fallback.nested is false: every operator on them raises an error that says\n"
                    "// so, instead of torch's \"Could not run ... 'NestedTensoropenreg'\".",
                    namespace="_",
                )
            )
        sparse = (
            [("SparsePrivateUse1", BOXED_SPARSE_FALLBACK), ("SparseCsrPrivateUse1", BOXED_SPARSE_COMPRESSED_FALLBACK)]
            if policy.sparse
            else [("SparsePrivateUse1", BOXED_REFUSE_SPARSE), ("SparseCsrPrivateUse1", BOXED_REFUSE_SPARSE)]
        )
        comment = (
            "// Sparse tensors have dispatch keys of their own (COO; CSR, CSC, BSR, BSC): every\n"
            "// operator on them runs its SparseCPU / SparseCsrCPU kernel on sparse CPU tensors\n"
            "// over CPU aliases of their indices and values (fallback.sparse)."
            if policy.sparse
            else "// Sparse tensors have dispatch keys of their own, and fallback.sparse is false:\n"
            "// every operator on them raises an error that says so, instead of torch's\n"
            "// \"Could not run ... 'Sparseopenreg'\"."
        )
        for key, function in sparse:
            blocks.append(cpp.library_block(key, [f"m.fallback({_boxed(function)});"], comment, namespace="_"))
        for key, function, ops in (
            ("SparsePrivateUse1", BOXED_SPARSE_FALLBACK, policy.sparse_ops),
            ("SparseCsrPrivateUse1", BOXED_SPARSE_COMPRESSED_FALLBACK, policy.sparse_compressed_ops),
        ):
            blocks.append(
                cpp.library_block(
                    key,
                    [cpp.impl_line(f.func.name, _boxed(function)) for f in ops],
                    f"// Operators with a {key.replace('PrivateUse1', 'CPU')} kernel and a composite one: the\n"
                    f"// dispatcher gives {key} the composite, which the fallback above never\n"
                    "// overrides, so the fallback is registered by name.",
                )
            )
    else:
        blocks.append(
            "// The global CPU fallback is off (fallback.global: false): operators without an\n"
            "// openreg kernel, and every operator on a nested or sparse tensor, raise torch's\n"
            '// "Could not run ..." error.\n\n'
        )
    per_op = [cpp.impl_line(r.name, _boxed(BOXED_FALLBACK)) for r in policy.ops]
    per_op += [cpp.impl_line(r.name, _boxed(BOXED_BLOCKED)) for r in policy.blocklist]
    if per_op:
        blocks.append(
            cpp.library_block(
                "PrivateUse1",
                per_op,
                "// The CPU fallback for single operators (fallback.ops), and the operators that\n"
                "// raise instead (fallback.blocklist).",
            )
        )
    return blocks


def _names(refs: tuple[OpRef, ...]) -> list[str]:
    return [cpp.cpp_string(f"aten::{r.name}") + "," for r in refs]


def emit(cfg: BackendConfig) -> dict[str, str]:
    rows = [
        f"{{{cpp.cpp_string(b.name)}, {cpp.route_value(b.route)}, {cpp.cpp_string(b.detail)}}},"
        for b in bindings(cfg)
    ]
    return {
        FILE: cpp.render(
            FILE,
            cfg,
            fallback_header=cpp.FALLBACK_HEADER,
            routes_header=cpp.ROUTES_HEADER,
            bindings=rows,
            cpu_tensor_args=_names(cfg.fallback.cpu_tensor_args),
            cpu_results=_names(cfg.fallback.cpu_results),
            global_fallback="true" if cfg.fallback.enabled else "false",
            nested_fallback="true" if cfg.fallback.nested else "false",
            sparse_fallback="true" if cfg.fallback.sparse else "false",
            registrations=registrations(cfg),
        )
    }
