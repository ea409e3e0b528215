"""RegisterKernels.cpp: the wrappers of the yaml's `kernels` (route `kernel`).

Signatures come from torchgen (``DispatcherSignature`` for what the dispatcher
calls, ``NativeSignature`` for what a kernel takes, ``translate`` between them),
so the generated code matches the operator schemas of the installed torch. The
custom operators' wrappers (custom_ops.py) are written by `kernel_wrapper` too.
"""

from __future__ import annotations

import itertools

from codegen import cpp
from codegen.model import BackendConfig, KernelEntry, Route
from torchgen.api.translate import translate
from torchgen.api.types import DispatcherSignature, NativeSignature
from torchgen.context import native_function_manager
from torchgen.model import TensorOptionsArguments

FILE = "RegisterKernels.cpp"


def kernel_signature(entry: KernelEntry) -> NativeSignature:
    return NativeSignature(entry.func.func, symint=entry.symint)


def device_guard(entry: KernelEntry) -> str:
    """Same precedence as torchgen's RegisterDispatchKey: factories guard on the
    `device` argument, other ops on self, then out=, then the first tensor."""
    f = entry.func
    if not entry.device_guard:
        return "// no device guard"
    if any(isinstance(a, TensorOptionsArguments) for a in f.func.arguments.non_out):
        return "const c10::DeviceGuard device_guard(c10::device_or_default(device));"
    self_arg = [f.func.arguments.self_arg.argument] if f.func.arguments.self_arg is not None else []
    candidates = itertools.chain(self_arg, f.func.arguments.out, f.func.arguments.flat_positional)
    tensor = next((a.name for a in candidates if a.type.is_tensor_like()), None)
    if tensor is None:
        return "// no tensor argument to guard on"
    return f"const ::openreg::OptionalDeviceGuard device_guard(at::device_of({tensor}));"


def device_check(entry: KernelEntry, name: str) -> list[str]:
    """The exact-same-device check torchgen generates for in-tree backends
    (c10::impl::check_and_update_common_device), over the tensor arguments."""
    f = entry.func
    args = [
        a.name
        for a in itertools.chain(f.func.arguments.out, f.func.arguments.flat_positional)
        if a.type.is_tensor_like()
    ]
    if not entry.device_check or not args:
        return ["// no device check"]
    return cpp.common_device_checks(name, args)


def kernel_wrapper(cfg: BackendConfig, entry: KernelEntry, name: str, traced_as: str | None) -> str:
    """A wrapper with the dispatcher's signature calling `entry`'s kernel;
    `traced_as` is the qualified operator name its trace scope shows, or None
    for no scope (Meta kernels)."""
    kernel = f"{cfg.cpp_namespace}::{entry.kernel}"
    body = [cpp.trace_scope(traced_as, entry.route, kernel)] if traced_as else []
    body += device_check(entry, name)
    body.append(device_guard(entry))
    with native_function_manager(entry.func):
        dispatcher = DispatcherSignature.from_schema(entry.func.func)
        exprs = translate(dispatcher.arguments(), kernel_signature(entry).arguments(), method=False)
        body.append(f"return {kernel}({', '.join(e.expr for e in exprs)});")
        lines = "\n".join("  " + line for line in body)
        return f"// {entry.func.func}\n{dispatcher.defn(name=name)} {{\n{lines}\n}}"


def emit(cfg: BackendConfig) -> dict[str, str]:
    if not cfg.kernels:
        return {FILE: cpp.nothing_to_register(cfg, "kernels")}

    def registration(e: KernelEntry) -> str:
        return cpp.impl_line(e.name, f"TORCH_FN({cpp.wrapper_name(e.name)})")

    fallthroughs = [
        cpp.impl_line(e.name, "torch::CppFunction::makeFallthrough()") for e in cfg.kernels if e.handles_conj_neg
    ]
    optional_blocks = [
        cpp.library_block(
            "AutogradPrivateUse1",
            [registration(e) for e in cfg.kernels if e.autograd],
            "// Autograd kernels of CompositeImplicitAutograd operators (`autograd: true`):\n"
            "// they replace torch's composite for openreg tensors, and autograd records the\n"
            "// operators they call.",
        ),
        cpp.library_block(
            "Conjugate",
            fallthroughs,
            "// Kernels that resolve conjugate and negative views themselves\n"
            "// (`handles_conj_neg: true`); without these fallthroughs the Conjugate and\n"
            "// Negative fallbacks (ATen/native/MathBitsFallback.h) would materialise their\n"
            "// inputs with clone(), which copies through the kernel again.",
        ),
        cpp.library_block("Negative", fallthroughs),
    ]
    return {
        FILE: cpp.render(
            FILE,
            cfg,
            native_header=cpp.NATIVE_HEADER,
            device_header=cpp.DEVICE_HEADER,
            trace_header=cpp.TRACE_HEADER,
            wrappers=[
                kernel_wrapper(cfg, e, cpp.wrapper_name(e.name), f"aten::{e.name}") + "\n\n" for e in cfg.kernels
            ],
            registrations=[registration(e) for e in cfg.kernels if not e.autograd],
            optional_blocks=[b for b in optional_blocks if b],
        )
    }
