"""RegisterStructured_*.cpp: PrivateUse1 wrappers for structured groups.

torchgen's StructuredRegisterDispatchKey writes these for in-tree keys only
(external backends get "Structured external backend functions are not
implemented yet"), so this emitter writes them the same way for PrivateUse1:
one class per functional / in-place / out= operator, derived from the in-tree
`at::native::structured_<kernel>` that CPU registers. meta() checks the
arguments and asks for the output through set_output_*; the class allocates it
on the openreg device, or resizes / proxies / checks the tensor the caller gave;
impl() then runs the CPU implementation, whose DispatchStubs reach the openreg
kernels registered in RegisterStubs.cpp. Between the two, the backend's
`prepare_structured_impl(op)` (STRUCTURED_PREPARE) sees the op object: openreg
uses it to hand CPU kernels addresses they may dereference.

Argument lists come from torchgen (`structured.meta_arguments`,
`structured.impl_arguments`, `translate`), so precomputed arguments and
SymInt conversions follow the schemas of the installed torch.
"""

from __future__ import annotations

from codegen.model import (
    CPU_KERNEL_HEADER,
    DEVICE_HEADER,
    NATIVE_HEADER,
    STRUCTURED_HEADER,
    STRUCTURED_NAMESPACE,
    STRUCTURED_PREPARE,
    TRACE_HEADER,
    BackendConfig,
    StructuredEntry,
    common_device_checks,
    trace_scope,
)
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

def indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line else line for line in text.splitlines())


def class_name(entry: StructuredEntry, kind: SchemaKind) -> str:
    return f"structured_{entry.stem}_{kind.name}"


def set_output_body(kind: SchemaKind, proxy: bool) -> str:
    if kind is SchemaKind.functional:
        return f"{STRUCTURED_NAMESPACE}::set_new_output(guard_, outputs_[output_idx], sizes, strides, options);"
    inplace = "true" if kind is SchemaKind.inplace else "false"
    proxy_slot = "&proxy_outputs_[output_idx]" if proxy else "nullptr"
    return f"{STRUCTURED_NAMESPACE}::set_given_output(guard_, outputs_[output_idx].get(), {inplace}, {proxy_slot}, sizes, strides, options);"


def gen_class(entry: StructuredEntry, f: NativeFunction) -> str:
    kind = f.func.kind()
    name = class_name(entry, kind)
    parent = entry.parent_class
    returns = len(f.func.returns)
    super_call = (
        f"\n  {parent}::set_output_raw_strided(output_idx, sizes, strides, options);"
        if entry.group.out.structured_inherits is not None
        else ""
    )
    setters = "\n".join(
        f"""  void set_output_{which}(
      int64_t output_idx, at::IntArrayRef sizes, at::IntArrayRef strides,
      at::TensorOptions options) override {{
{indent(set_output_body(kind, proxy), 4)}
    // The parent's set_output comes last so that it sees the output through
    // maybe_get_output.{indent(super_call, 2)}
  }}"""
        for which, proxy in (("strided", True), ("raw_strided", False))
    )
    if kind is SchemaKind.functional:
        ctor = ""
        fields = f"  std::array<at::Tensor, {returns}> outputs_;"
        get = "outputs_[output_idx]"
    else:
        if kind is SchemaKind.inplace:
            ctor = f"  explicit {name}(at::Tensor& self) : outputs_{{std::ref(self)}} {{}}\n"
        else:
            params = ", ".join(f"at::Tensor& out{i}" for i in range(returns))
            refs = ", ".join(f"std::ref(out{i})" for i in range(returns))
            explicit = "explicit " if returns == 1 else ""
            ctor = f"  {explicit}{name}({params}) : outputs_{{{refs}}} {{}}\n"
        fields = (
            f"  std::array<std::reference_wrapper<at::Tensor>, {returns}> outputs_;\n"
            f"  std::array<std::optional<at::Tensor>, {returns}> proxy_outputs_;"
        )
        get = "proxy_outputs_[output_idx].has_value() ? *proxy_outputs_[output_idx] : outputs_[output_idx].get()"
    return f"""struct {name} final : public {parent} {{
{ctor}{setters}
  const at::Tensor& maybe_get_output(int64_t output_idx) override {{
    return {get};
  }}
{fields}
  ::openreg::OptionalDeviceGuard guard_;
}};"""


def wrapper_signature(f: NativeFunction) -> NativeSignature:
    # The in-tree structured kernels take int, not SymInt; the dispatcher
    # converts when it calls a non-SymInt kernel.
    return NativeSignature(f.func, prefix="wrapper_PrivateUse1_", symint=False)


def impl_declaration(entry: StructuredEntry) -> str:
    """An openreg impl() function: the parameters of the group's impl()."""
    with native_function_manager(entry.group.out):
        params = ", ".join(a.decl() for a in structured.impl_arguments(entry.group))
    return f"void {entry.impl}({params})"


def gen_wrapper(entry: StructuredEntry, f: NativeFunction, namespace: str) -> str:
    g = entry.group
    kind = f.func.kind()
    sig = wrapper_signature(f)
    context: list[Binding | Expr] = list(sig.arguments())
    body = [trace_scope(f"aten::{f.func.name}", "Structured", entry.serving(namespace))]
    name = class_name(entry, kind)
    if entry.host_impl:
        # Host aliases are made of openreg tensors only: every tensor must be
        # on one device first (meta() and impl() do not check that).
        body += common_device_checks(
            str(f.func.name), [a.name for a in f.func.arguments.flat_all if a.type.is_tensor_like()]
        )
    if kind is SchemaKind.functional:
        body.append(f"{name} op;")
    elif kind is SchemaKind.inplace:
        body.append(f"{name} op(self);")
    else:
        body.append(f"{name} op({', '.join(a.name for a in f.func.arguments.out)});")

    meta_exprs = ", ".join(e.expr for e in translate(context, structured.meta_arguments(g), method=False))
    if g.out.precomputed:
        # meta() returns the precomputed values impl() takes in place of
        # (or after) some arguments.
        body.append(f"auto precompute = op.meta({meta_exprs});")
        for elems in [*g.out.precomputed.replace.values(), g.out.precomputed.add]:
            context.extend(
                Expr(expr=f"precompute.{a.name}", type=structured.argument_type(a, binds=a.name))
                for a in elems
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
    if entry.host_impl:
        # CPU's impl() on CPU aliases of the tensors (CpuImplOperands,
        # OpenRegStructured.h); an impl that also runs the iterator meta() built (gelu's
        # ATen kernel) finds it on kernel addresses.
        tensors = [i for i, a in enumerate(impl_args) if a.nctype.type == ConstRefCType(BaseCType(tensorT))]
        body.append(f"::{namespace}::{STRUCTURED_PREPARE}(op);")
        body.append(f"{STRUCTURED_NAMESPACE}::CpuImplOperands<{len(tensors)}> aliases({impl_exprs[tensors[-1]]});")
        for i in tensors:
            impl_exprs[i] = f"aliases({impl_exprs[i]})"
        body.append(f"op.impl({', '.join(impl_exprs)});")
        body.append(f'aliases.check_kept("aten::{f.func.name}");')
    elif entry.impl is not None:
        body.append(f"::{namespace}::{entry.impl}({', '.join(impl_exprs)});")
    else:
        body.append(f"::{namespace}::{STRUCTURED_PREPARE}(op);")
        body.append(f"op.impl({', '.join(impl_exprs)});")

    returns = len(f.func.returns)
    if kind is not SchemaKind.functional:
        body += [
            f"if (op.proxy_outputs_[{i}].has_value()) {{\n  op.outputs_[{i}].get().copy_(*op.proxy_outputs_[{i}]);\n}}"
            for i in range(returns)
        ]
    if kind is SchemaKind.functional:
        moved = [f"std::move(op.outputs_[{i}])" for i in range(returns)]
        ret = moved[0] if returns == 1 else f"std::make_tuple({', '.join(moved)})"
    elif kind is SchemaKind.inplace:
        ret = "self"
    else:
        outs = [a.name for a in f.func.arguments.out]
        ret = outs[0] if returns == 1 else f"std::forward_as_tuple({', '.join(outs)})"
    body.append(f"return {ret};")
    return f"""// {f.func}
{sig.defn()} {{
{indent(chr(10).join(body), 2)}
}}"""


# RegisterStructured_{i}.cpp: several translation units, so that a build
# compiles them in parallel and a change to the yaml recompiles only some.
SHARDS = 4


def shard_name(i: int) -> str:
    return f"RegisterStructured_{i}.cpp"


def register_structured(cfg: BackendConfig, banner: str) -> dict[str, str]:
    """Each structured group goes to one shard, in yaml order."""
    entries = list(cfg.structured)
    return {
        shard_name(i): register_shard(entries[i * len(entries) // SHARDS : (i + 1) * len(entries) // SHARDS], cfg.cpp_namespace, banner)
        for i in range(SHARDS)
    }


def register_shard(entries: list[StructuredEntry], namespace: str, banner: str) -> str:
    blocks, impls, headers = [], [], set()
    for entry in entries:
        headers.add(f"ATen/ops/{entry.group.root_name}_{'meta' if entry.impl is not None else 'native'}.h")
        for f in entry.functions():  # the loader admits no group with a mutable variant
            with native_function_manager(f):
                blocks.append(gen_class(entry, f) + "\n\n" + gen_wrapper(entry, f, namespace))
                impls.append(f'  m.impl("{f.func.name}", TORCH_FN({wrapper_signature(f).name()}));')
    if not blocks:
        return f"{banner}\n// No structured groups in this shard.\n"
    includes = "".join(f"#include <{h}>\n" for h in sorted(headers))
    if any(entry.host_impl for entry in entries):
        includes += "#include <ATen/core/op_registration/adaption.h>\n"  # check_and_update_common_device
    if any(entry.impl is not None for entry in entries):
        includes += f'\n#include "{NATIVE_HEADER}"\n'  # the openreg impl() functions
    body = "\n\n".join(blocks)
    registrations = "TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {\n" + "\n".join(impls) + "\n}\n"
    return f"""{banner}
#include <torch/library.h>
{includes}
#include "{CPU_KERNEL_HEADER}"
#include "{DEVICE_HEADER}"
#include "{STRUCTURED_HEADER}"
#include "{TRACE_HEADER}"

namespace at {{
namespace {{

{body}

}} // namespace

{registrations}
}} // namespace at
"""
