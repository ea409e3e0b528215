"""OpenRegNativeFunctions.h: the declarations of every function the yaml names
(kernels, custom operators' kernels and Meta kernels, structured impl()s,
stub kernels)."""

from __future__ import annotations

from codegen import cpp
from codegen.emit.custom_ops import kernel_entries
from codegen.emit.kernels import kernel_signature
from codegen.emit.structured import impl_declaration
from codegen.model import BackendConfig
from torchgen.context import native_function_manager

FILE = cpp.NATIVE_HEADER


def emit(cfg: BackendConfig) -> dict[str, str]:
    decls = []
    entries = list(cfg.kernels) + [e for op in cfg.custom_ops for e in kernel_entries(op)]
    declared: set[tuple[str, str]] = set()
    for entry in entries:
        # A custom operator may use one function as its kernel and its meta kernel.
        if (key := (entry.kernel, str(entry.func.func))) in declared:
            continue
        declared.add(key)
        with native_function_manager(entry.func):
            schema = entry.func.func if entry.func.namespace == "aten" else f"{entry.func.namespace}::{entry.func.func}"
            decls.append(f"// {schema}\n{kernel_signature(entry).decl(name=entry.kernel)};\n\n")
    for s in (s for s in cfg.structured if s.impl is not None):
        decls.append(f"// impl() of the structured {s.name}, after {s.parent_class}::meta\n{impl_declaration(s)};\n\n")
    stubs = [st for st in cfg.stubs if st.kernel is not None]
    for st in stubs:
        # Declared with the stub's own function type, so the kernel's
        # definition must have exactly the stub's parameters.
        decls.append(
            f"// DispatchStub {st.decl.qualified_name} ({st.decl.header})\n"
            f"std::remove_pointer_t<decltype({st.decl.qualified_name})::FnPtr> {st.kernel};\n\n"
        )
    return {
        FILE: cpp.render(
            FILE,
            cfg,
            namespace=cfg.cpp_namespace,
            stub_headers=cpp.includes({st.decl.header for st in stubs}, system=True),
            declarations=decls,
        )
    }
