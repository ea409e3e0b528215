"""RegisterCustomOps.cpp: the operators declared under `custom_ops` (route `custom_op`).

For each operator: its schema in TORCH_LIBRARY(openreg), the PrivateUse1 kernel
(behind a wrapper with device checks and a device guard), the Meta kernel
FakeTensor and torch.compile trace with, and an AutogradPrivateUse1 kernel.
That kernel is a torch::autograd::Function calling the operator's `backward`
(itself a custom operator, so it runs on the device and traces the same way);
without a backward it is torch's autogradNotImplementedFallback, so forward
works and backward raises a clear error.
"""

from __future__ import annotations

from codegen import cpp
from codegen.emit.kernels import kernel_wrapper
from codegen.model import BackendConfig, CustomOp, KernelEntry, Route
from torchgen.api.types import DispatcherSignature
from torchgen.context import native_function_manager

FILE = "RegisterCustomOps.cpp"


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def kernel_entries(op: CustomOp) -> tuple[KernelEntry, KernelEntry]:
    """The device kernel and the Meta kernel, as kernel entries: they get the
    same declarations and wrappers as the aten kernels."""
    device = KernelEntry(
        func=op.func, kernel=op.kernel, symint=True, device_guard=True, device_check=True,
        handles_conj_neg=False, autograd=False, loc=op.loc, route=Route.custom_op,
    )
    meta = KernelEntry(
        func=op.func, kernel=op.meta, symint=True, device_guard=False, device_check=False,
        handles_conj_neg=False, autograd=False, loc=op.loc, route=Route.custom_op,
    )
    return device, meta


def typed_handle(cfg: BackendConfig, op: CustomOp, var: str) -> str:
    sig = DispatcherSignature.from_schema(op.func.func)
    return (
        f"static const auto {var} = c10::Dispatcher::singleton()\n"
        f'      .findSchemaOrThrow("{cfg.custom_namespace}::{op.name.name}", "{op.name.overload_name}")\n'
        f"      .typed<{sig.type()}>();"
    )


def value_type(cpp_type: str) -> str:
    """The owning C++ type to read a saved non-tensor argument back as."""
    return cpp_type.replace("const ", "").replace("&", "").strip()


def autograd_function(cfg: BackendConfig, op: CustomOp) -> str:
    bwd = cfg.custom_op(op.backward or "")
    assert bwd is not None  # checked by the loader
    name = f"{camel(str(op.name.name))}Function"
    fwd_sig = DispatcherSignature.from_schema(op.func.func)
    fwd_args = fwd_sig.arguments()
    by_name = {b.name: b for b in fwd_args}
    needed = [a.name for a in bwd.func.func.arguments.flat_all]
    saved_tensors = [n for n in needed if n == "result" or (n in by_name and by_name[n].argument.type.is_tensor_like())]
    saved_values = [n for n in needed if n in by_name and not by_name[n].argument.type.is_tensor_like()]

    params = ", ".join(["torch::autograd::AutogradContext* ctx"] + [b.decl() for b in fwd_args])
    forward_lines = [
        typed_handle(cfg, op, "op"),
        "at::Tensor result;",
        "{",
        "  at::AutoDispatchBelowADInplaceOrView below_autograd;",
        f"  result = op.call({', '.join(b.name for b in fwd_args)});",
        "}",
    ]
    forward_lines += [f'ctx->saved_data["{n}"] = {n};' for n in saved_values]
    if saved_tensors:
        forward_lines.append(f"ctx->save_for_backward({{{', '.join(saved_tensors)}}});")
    forward_lines.append("return result;")

    backward_lines = [typed_handle(cfg, bwd, "backward_op")]
    if saved_tensors:
        backward_lines.append("const auto saved = ctx->get_saved_variables();")
    for i, n in enumerate(saved_tensors):
        if n != "result" and by_name[n].argument.type.is_nullable():
            backward_lines.append(
                f"const std::optional<at::Tensor> {n} = saved[{i}].defined() ? std::optional<at::Tensor>(saved[{i}]) : std::nullopt;"
            )
        else:
            backward_lines.append(f"const at::Tensor& {n} = saved[{i}];")
    for n in saved_values:
        cpp = value_type(by_name[n].type)
        backward_lines.append(f'const auto {n} = ctx->saved_data["{n}"].to<{cpp}>();')
    backward_lines.append("const at::Tensor& grad = grad_outputs[0];")
    call = f"backward_op.call({', '.join(needed)})"
    tensor_args = [b for b in fwd_args if b.argument.type.is_tensor_like()]
    if len(tensor_args) == 1:
        backward_lines.append(f"const at::Tensor grad_{tensor_args[0].name} = {call};")
    else:
        backward_lines.append(f"const auto grads = {call};")
        backward_lines += [
            f"const at::Tensor& grad_{b.name} = std::get<{i}>(grads);" for i, b in enumerate(tensor_args)
        ]
    returned = [f"grad_{b.name}" if b.argument.type.is_tensor_like() else "at::Tensor()" for b in fwd_args]
    backward_lines.append(f"return {{{', '.join(returned)}}};")

    def block(lines: list[str]) -> str:
        return "\n".join("    " + line.replace("\n", "\n    ") for line in lines)

    return f"""// Autograd for {cfg.custom_namespace}::{op.name}: the gradients come from {cfg.custom_namespace}::{bwd.name}.
struct {name} : public torch::autograd::Function<{name}> {{
  static at::Tensor forward({params}) {{
{block(forward_lines)}
  }}

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {{
{block(backward_lines)}
  }}
}};

{fwd_sig.defn(name=f"autograd_{op.name.name}")} {{
  return {name}::apply({', '.join(b.name for b in fwd_args)});
}}"""


def emit(cfg: BackendConfig) -> dict[str, str]:
    if not cfg.custom_ops:
        return {FILE: cpp.nothing_to_register(cfg, "custom_ops")}
    ns = cfg.custom_namespace
    definitions, schemas, device, metas, autograd = [], [], [], [], []
    for op in cfg.custom_ops:
        with native_function_manager(op.func):
            device_entry, meta_entry = kernel_entries(op)
            name = str(op.name)
            device_wrapper = cpp.wrapper_name(op.name.name)
            meta_wrapper = f"wrapper_Meta_{op.name.name}"
            definitions.append(kernel_wrapper(cfg, device_entry, device_wrapper, f"{ns}::{name}") + "\n\n")
            definitions.append(kernel_wrapper(cfg, meta_entry, meta_wrapper, None) + "\n\n")
            if op.backward:
                definitions.append(autograd_function(cfg, op) + "\n\n")
            schemas.append(f'm.def("{op.func.func}", {{at::Tag::pt2_compliant_tag}});')
            device.append(cpp.impl_line(name, f"TORCH_FN({device_wrapper})"))
            metas.append(cpp.impl_line(name, f"TORCH_FN({meta_wrapper})"))
            if op.backward:
                autograd.append(cpp.impl_line(name, f"TORCH_FN(autograd_{op.name.name})"))
            else:
                autograd.append(cpp.impl_line(name, "torch::autograd::autogradNotImplementedFallback()"))
    return {
        FILE: cpp.render(
            FILE,
            cfg,
            namespace=ns,
            native_header=cpp.NATIVE_HEADER,
            device_header=cpp.DEVICE_HEADER,
            trace_header=cpp.TRACE_HEADER,
            definitions=definitions,
            schemas=schemas,
            device_registrations=device,
            meta_registrations=metas,
            autograd_registrations=autograd,
        )
    }
