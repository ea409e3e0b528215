"""RegisterCpuKernels.cpp: PrivateUse1 wrappers that run an operator's own CPU
kernel on CPU aliases of the device memory (route `cpu_kernel`).

For each `cpu_kernels` entry the wrapper has the dispatcher's signature and
drives a CPU kernel call (cpp.CPU_KERNEL_CALL, csrc/operators/cpu) argument by
argument, as the boxed CPU fallback does at run time, but with every type known
here: it notes where each operand lives, begins the call (device guard, stream
order, CPU allocations redirected to device memory), calls the operator's
CPU kernel with CPU aliases of the operands, and returns written operands as
themselves and fresh results as openreg tensors over the memory the CPU kernel
allocated. When the kernel may be queued (a busy stream, a large kernel), the
wrapper hands its arguments, boxed, to the launch of CPU kernels
(operators/cpu/OpenRegBoxedCpuKernel.h), except for operators that torch tags as having
results of data-dependent shape or host results, and random draws without a
generator argument: those run at once.

The CPU kernel is called as the C++ function torch generates for it
(``at::cpu::sum``, or the composite namespace whose kernel CPU's dispatch table
holds), not redispatched, which would cost a dispatch-table lookup per call. So
a CPU kernel registered over torch's own (torch.library) is not what openreg runs.
"""

from __future__ import annotations

from codegen import cpp
from codegen.model import BackendConfig, CpuKernelEntry
from codegen.native import cpu_dispatch_namespace, cpu_function
from torchgen.api.translate import translate
from torchgen.api.types import DispatcherSignature, Expr
from torchgen.context import native_function_manager
from torchgen.model import Argument, BaseTy, BaseType, ListType, OptionalType, Type

FILE = "RegisterCpuKernels.cpp"


def _kind(t: Type) -> str:
    """How the CPU kernel call treats an argument of type `t`: "tensor", "tensors",
    "generator", "device", or "" (passed unchanged)."""
    base = t.elem if isinstance(t, OptionalType) else t
    if isinstance(base, BaseType):
        if base.name == BaseTy.Tensor:
            return "tensor"
        if base.name == BaseTy.Generator:
            return "generator"
        if base.name == BaseTy.Device:
            return "device"
    if isinstance(t, ListType) and t.is_tensor_like():
        return "tensors"
    return ""


def _note(a: Argument) -> str | None:
    kind = _kind(a.type)
    if not kind:
        return None
    value = a.name
    if kind in ("generator", "device") and not isinstance(a.type, OptionalType):
        value = f"std::optional({a.name})"
    written = ", /*written=*/true" if kind == "tensor" and a.is_write else ""
    return f'  call.note({value}, "{a.name}"{written});'


def _same_object_input(a: Argument, written: list[Argument]) -> bool:
    """Whether `a` is a Tensor input that may be the one out= tensor."""
    return len(written) == 1 and str(a.type) == "Tensor" and not a.is_write


def _host_expr(a: Argument, written: list[Argument]) -> str:
    kind = _kind(a.type)
    if not kind:
        return a.name
    if kind == "tensor" and a.is_write:
        return f"{a.name}_alias"  # a local: the CPU function takes a Tensor&
    if _same_object_input(a, written):
        # An input that is the out= tensor reaches the CPU function as the very
        # object of the out= alias: CPU kernels compare them by address
        # (addr_out's `&result == &self`, which addr_ relies on).
        out = written[0].name
        return f"({a.name}.is_same({out}) ? {out}_alias : call.alias({a.name}))"
    if kind == "generator":
        return f"call.generator({a.name})" if isinstance(a.type, OptionalType) else f"*call.generator({a.name})"
    if kind == "device":
        return f"call.device({a.name})" if isinstance(a.type, OptionalType) else f"*call.device({a.name})"
    return f"call.alias({a.name})"


# torch's tags of operators whose CPU kernel is never queued (OpenRegBoxedCpuKernel.cpp, never_queued).
NEVER_QUEUED_TAGS = frozenset({"dynamic_output_shape", "data_dependent_output"})


def _may_queue(entry: CpuKernelEntry, arguments: list[Argument]) -> bool:
    """Whether the wrapper may hand its call to the launch of CPU kernels: not for
    the tags above, nor for device arguments (a call with one runs at once
    there), nor for random draws without a generator argument (never_queued)."""
    if NEVER_QUEUED_TAGS & set(entry.func.tags):
        return False
    kinds = [_kind(a.type) for a in arguments if isinstance(a, Argument)]
    if "nondeterministic_seeded" in entry.func.tags and "generator" not in kinds:
        return False
    return "device" not in kinds


def _queue_branch(entry: CpuKernelEntry, sig: DispatcherSignature, outs: list[Argument]) -> list[str]:
    name = entry.func.func.name
    args = ", ".join(a.name for a in sig.arguments())
    # A boxed call gives each argument its own object: an input that is the
    # out= runs at once, where _host_expr passes the out='s alias for it.
    inputs = [a for a in sig.arguments() if isinstance(a.argument, Argument) and _same_object_input(a.argument, outs)]
    distinct = "".join(f" && !{a.name}.is_same({outs[0].name})" for a in inputs)
    return [
        f"  if (call.may_queue(){distinct}) {{",
        f'    static const c10::OperatorHandle op = {cpp.CPU_KERNEL_OPERATOR}("aten::{name.name}", "{name.overload_name}");',
        f"    return {cpp.LAUNCH_CPU_KERNEL}<{sig.type()}>(op, {args});",
        "  }",
    ]


def _returns(entry: CpuKernelEntry) -> tuple[str, str]:
    """(how the CPU function's value is kept, the return statement)."""
    schema = entry.func.func
    aliased = schema.aliased_return_names()
    returns = schema.returns
    if not returns:
        return "", ""
    if len(returns) == 1:
        if aliased[0] is not None:
            return "", f"  return {aliased[0]};"
        if returns[0].type.is_tensor_like():
            return "auto result = ", "  return call.result(std::move(result));"
        return "const auto result = ", "  return result;"
    parts = []
    for i, (r, name) in enumerate(zip(returns, aliased)):
        if name is not None:
            parts.append(name)
        elif r.type.is_tensor_like():
            # Each element is moved once: no reference counting for results.
            parts.append(f"call.result(std::get<{i}>(std::move(result)))")
        else:
            parts.append(f"std::get<{i}>(result)")
    if all(name is not None for name in aliased):
        return "", f"  return std::forward_as_tuple({', '.join(parts)});"
    return "auto result = ", f"  return std::make_tuple({', '.join(parts)});"


def cpu_kernel_wrapper(entry: CpuKernelEntry) -> str:
    f = entry.func
    op = f"aten::{entry.name}"
    with native_function_manager(f):
        sig = DispatcherSignature.from_schema(f.func)
        arguments = [b.argument for b in sig.arguments()]
        notes = [n for n in (_note(a) for a in arguments if isinstance(a, Argument)) if n is not None]
        outs = [a for a in arguments if isinstance(a, Argument) and _kind(a.type) == "tensor" and a.is_write]
        written = [f"  at::Tensor {a.name}_alias = call.written({a.name});" for a in outs]
        namespace, cpu_sig = cpu_function(f)
        host = [Expr(_host_expr(b.argument, outs), b.nctype) for b in sig.arguments() if isinstance(b.argument, Argument)]
        exprs = ", ".join(e.expr for e in translate(host, cpu_sig.arguments(), method=False))
        keep, ret = _returns(entry)
        accepts = "true" if entry.accepts_cpu_tensors else "false"
        kernel = f"{namespace}::{cpu_sig.name()}"
        body = [
            f"  {cpp.trace_scope(op, entry.route, kernel)}",
            f'  {cpp.CPU_KERNEL_CALL} call("{op}", /*accepts_cpu_tensors=*/{accepts});',
            *notes,
            *(_queue_branch(entry, sig, outs) if _may_queue(entry, arguments) else []),
            "  call.begin();",
            *written,
            f"  {keep}{kernel}({exprs});",
            "  call.finish();",
        ]
        if ret:
            body.append(ret)
        return f"// {f.func}\n{sig.defn(name=cpp.wrapper_name(entry.name))} {{\n" + "\n".join(body) + "\n}\n\n"


def emit(cfg: BackendConfig) -> dict[str, str]:
    if not cfg.cpu_kernels:
        return {FILE: cpp.nothing_to_register(cfg, "cpu_kernels")}
    entries = cfg.cpu_kernels
    return {
        FILE: cpp.render(
            FILE,
            cfg,
            call_header=cpp.CPU_KERNEL_CALL_HEADER,
            boxed_header=cpp.BOXED_CPU_KERNEL_HEADER,
            trace_header=cpp.TRACE_HEADER,
            cpu_function_headers=cpp.includes(
                {f"ATen/ops/{e.func.root_name}_{cpu_dispatch_namespace(e.func)}_dispatch.h" for e in entries},
                system=True,
            ),
            wrappers=[cpu_kernel_wrapper(e) for e in entries],
            registrations=[cpp.impl_line(e.name, f"TORCH_FN({cpp.wrapper_name(e.name)})") for e in entries],
        )
    }
