"""RegisterStructured_*.cpp: PrivateUse1 wrappers for structured groups.

torchgen's StructuredRegisterDispatchKey writes these for in-tree keys only
(external backends get "Structured external backend functions are not
implemented yet"), so this emitter writes them the same way for PrivateUse1:
a wrapper per functional / in-place / out= operator runs meta() on an object of
`openreg::structured::FunctionalOp`, `OutOp` or `InplaceOp` (csrc/operators/
OpenRegStructured.h), class templates over the structured class whose meta()
runs. meta() checks the arguments and asks for the outputs, which the object
allocates on the openreg device or resizes / checks / proxies; impl() then
computes them, as the entry's Route says:

- structured: CPU's impl() on the device tensors; its DispatchStubs reach the
  kernels of RegisterStubs.cpp. Between meta() and impl(),
  `prepare_structured_impl(op)` hands an iterator kernel addresses, for CPU
  impls that call their CPU kernel directly instead of through a stub;
- structured_impl: an openreg function with impl()'s parameters;
- structured_on_cpu_aliases: CPU's impl() launched as a kernel, on CPU tensors
  at the operands' kernel addresses, for impls that call their CPU kernel with
  kCPU or a stub that takes tensors.

Argument lists come from torchgen (`structured.meta_arguments`,
`structured.impl_arguments`, `translate`), so precomputed arguments and
SymInt conversions follow the schemas of the installed torch.
"""

from __future__ import annotations

from codegen import cpp
from codegen.model import BackendConfig, Route, StructuredEntry
from torchgen.api import structured
from torchgen.api.translate import translate
from torchgen.api.types import (
    BaseCType,
    Binding,
    ConstRefCType,
    Expr,
    MutRefCType,
    NamedCType,
    NativeSignature,
    tensorT,
)
from torchgen.context import native_function_manager
from torchgen.model import NativeFunction, SchemaKind

# RegisterStructured_{i}.cpp: several translation units, so that a build
# compiles them in parallel and a change to the yaml recompiles only some.
SHARDS = 4
TEMPLATE = "RegisterStructured.cpp"


def shard_name(i: int) -> str:
    return f"RegisterStructured_{i}.cpp"


def op_class(entry: StructuredEntry, f: NativeFunction) -> str:
    """The openreg::structured class template the wrapper of `f` instantiates."""
    kind = f.func.kind()
    returns = len(f.func.returns)
    parent_sets_output = "true" if entry.group.out.structured_inherits is not None else "false"
    ns = cpp.STRUCTURED_NAMESPACE
    if kind is SchemaKind.functional:
        return f"{ns}::FunctionalOp<{entry.parent_class}, {returns}, {parent_sets_output}>"
    if kind is SchemaKind.inplace:
        return f"{ns}::InplaceOp<{entry.parent_class}, {parent_sets_output}>"
    return f"{ns}::OutOp<{entry.parent_class}, {returns}, {parent_sets_output}>"


def impl_declaration(entry: StructuredEntry) -> str:
    """An openreg impl() function: the parameters of the group's impl()."""
    with native_function_manager(entry.group.out):
        params = ", ".join(a.decl() for a in structured.impl_arguments(entry.group))
    return f"void {entry.impl}({params})"


def wrapper(entry: StructuredEntry, f: NativeFunction, namespace: str) -> str:
    g = entry.group
    kind = f.func.kind()
    # The in-tree structured kernels take int, not SymInt; the dispatcher
    # converts when it calls a non-SymInt kernel.
    sig = NativeSignature(f.func, symint=False)
    context: list[Binding | Expr] = list(sig.arguments())
    body = [cpp.trace_scope(f"aten::{f.func.name}", entry.route, entry.serving(namespace))]
    if entry.route is Route.structured_on_cpu_aliases:
        # CPU aliases are made of openreg tensors only: every tensor must be
        # on one device first (meta() and impl() do not check that).
        body += cpp.common_device_checks(
            str(f.func.name), [a.name for a in f.func.arguments.flat_all if a.type.is_tensor_like()]
        )
        # OPENREG_DISCRETE_MEMORY=1: CPU's kernel of the operator on host
        # copies (the boxed CPU kernel stages them), as a device whose memory
        # CPU code cannot address must run it.
        overload = f.func.name.overload_name
        args = ", ".join(a.name for a in sig.arguments())
        body += [
            "if (C10_UNLIKELY(::openreg::discrete_memory())) {",
            f'  static const c10::OperatorHandle cpu_op = ::openreg::cpu_kernel_operator("aten::{f.func.name.name}", "{overload}");',
            f"  return ::openreg::launch_cpu_kernel<decltype({cpp.wrapper_name(f.func.name)})>(cpu_op, {args});",
            "}",
        ]
    outputs = {SchemaKind.functional: "", SchemaKind.inplace: "(self)"}.get(
        kind, f"({', '.join(a.name for a in f.func.arguments.out)})"
    )
    body.append(f"{op_class(entry, f)} op{outputs};")

    meta_exprs = ", ".join(e.expr for e in translate(context, structured.meta_arguments(g), method=False))
    if g.out.precomputed:
        # meta() returns the precomputed values impl() takes in place of
        # (or after) some arguments.
        body.append(f"auto precompute = op.meta({meta_exprs});")
        for elems in [*g.out.precomputed.replace.values(), g.out.precomputed.add]:
            context.extend(
                Expr(expr=f"precompute.{a.name}", type=structured.argument_type(a, binds=a.name)) for a in elems
            )
        body.append("(void)precompute;")
    else:
        body.append(f"op.meta({meta_exprs});")

    for i, out_arg in enumerate(structured.out_arguments(g)):
        assert out_arg.nctype.type == ConstRefCType(BaseCType(tensorT))
        expr = f"op.maybe_get_output({i})" if kind is SchemaKind.out else f"op.outputs_[{i}]"
        context.append(Expr(expr=expr, type=NamedCType(out_arg.nctype.name, MutRefCType(BaseCType(tensorT)))))
    impl_args = structured.impl_arguments(g)
    impl_exprs = [e.expr for e in translate(context, impl_args, method=False)]
    if entry.route is Route.structured_on_cpu_aliases:
        body += cpu_impl_launch(entry, f, impl_args, impl_exprs, namespace)
    elif entry.route is Route.structured_impl:
        body.append(f"::{namespace}::{entry.impl}({', '.join(impl_exprs)});")
    else:
        body.append(f"::{namespace}::{cpp.STRUCTURED_PREPARE}(op);")
        body.append(f"op.impl({', '.join(impl_exprs)});")

    returns = len(f.func.returns)
    if kind is SchemaKind.functional:
        moved = [f"std::move(op.outputs_[{i}])" for i in range(returns)]
        ret = moved[0] if returns == 1 else f"std::make_tuple({', '.join(moved)})"
    else:
        body.append("op.copy_back();")
        if kind is SchemaKind.inplace:
            ret = "self"
        else:
            outs = [a.name for a in f.func.arguments.out]
            ret = outs[0] if returns == 1 else f"std::forward_as_tuple({', '.join(outs)})"
    body.append(f"return {ret};")
    lines = "\n".join("  " + line for line in "\n".join(body).splitlines())
    return f"// {f.func}\n{sig.defn(name=cpp.wrapper_name(f.func.name))} {{\n{lines}\n}}\n\n"


def cpu_impl_launch(
    entry: StructuredEntry, f: NativeFunction, impl_args: list[Binding], impl_exprs: list[str], namespace: str
) -> list[str]:
    """structured_on_cpu_aliases: CPU's impl() launched as a kernel
    (launch_structured_cpu_impl, native/CpuIterator.h). Its tensor arguments
    become the kernel's CPU tensors `t[i]`; every other argument is captured
    by value (kernel_argument), as the kernel runs after the wrapper returns."""
    tensors: list[str] = []
    captures: list[str] = []
    args: list[str] = []
    strings: list[str] = []
    for a, expr in zip(impl_args, impl_exprs):
        if "string_view" in a.nctype.type.cpp_type():
            strings.append(expr)
        if a.nctype.type == ConstRefCType(BaseCType(tensorT)):
            args.append(f"t[{len(tensors)}]")
            # An in-place wrapper's output is a reference_wrapper.
            tensors.append(f"&{expr}" if "outputs_" not in expr else f"&static_cast<const at::Tensor&>({expr})")
        else:
            # The loader admits no other tensor type under on_cpu_aliases.
            assert "Tensor" not in a.nctype.type.cpp_type(), (f.func.name, a.name)
            captures.append(f"a{len(captures)} = ::openreg::kernel_argument({expr})")
            args.append(f"a{len(captures) - 1}")
    # An impl that also runs the iterator meta() built (gelu's ATen kernel)
    # finds it on kernel addresses.
    # impl() checks a string argument as it runs (gelu's `approximate`): each
    # value's first launch runs in the calling thread, where its error raises.
    key = f", ::openreg::native::strings_key({{{', '.join(strings)}}})" if strings else ""
    return [
        f"::{namespace}::{cpp.STRUCTURED_PREPARE}(op);",
        "static ::openreg::SeenDtypes seen;",
        f"::{namespace}::launch_structured_cpu_impl<{entry.parent_class}, {len(tensors)}>(",
        f'    op, "aten::{f.func.name}", seen, {{{", ".join(tensors)}}},',
        f"    [{', '.join(captures)}](auto& impl, const auto& t) {{ impl.impl({', '.join(args)}); }}{key});",
    ]


def shard(cfg: BackendConfig, entries: list[StructuredEntry]) -> str:
    if not entries:
        return cpp.nothing_to_register(cfg, "structured groups for this shard")
    wrappers, registrations, torch_headers = [], [], set()
    openreg_headers = {cpp.DEVICE_HEADER, cpp.STRUCTURED_HEADER, cpp.TRACE_HEADER}
    for entry in entries:
        torch_headers.add(f"ATen/ops/{entry.group.root_name}_{'meta' if entry.impl is not None else 'native'}.h")
        if entry.route is Route.structured_impl:
            openreg_headers.add(cpp.NATIVE_HEADER)
        else:
            openreg_headers.add(cpp.CPU_ITERATOR_HEADER)
        if entry.route is Route.structured_on_cpu_aliases:
            torch_headers.add("ATen/core/op_registration/adaption.h")  # check_and_update_common_device
            openreg_headers.add(cpp.BOXED_CPU_KERNEL_HEADER)  # launch_cpu_kernel
        for f in entry.functions():  # the loader admits no group with a mutable variant
            with native_function_manager(f):
                wrappers.append(wrapper(entry, f, cfg.cpp_namespace))
                registrations.append(cpp.impl_line(f.func.name, f"TORCH_FN({cpp.wrapper_name(f.func.name)})"))
    return cpp.render(
        TEMPLATE,
        cfg,
        structured_header=cpp.STRUCTURED_HEADER,
        torch_headers=cpp.includes(torch_headers, system=True),
        openreg_headers=cpp.includes(openreg_headers, system=False),
        wrappers=wrappers,
        registrations=registrations,
    )


def emit(cfg: BackendConfig) -> dict[str, str]:
    """Each structured group goes to one shard, in yaml order."""
    entries = list(cfg.structured)
    n = len(entries)
    return {shard_name(i): shard(cfg, entries[i * n // SHARDS : (i + 1) * n // SHARDS]) for i in range(SHARDS)}
