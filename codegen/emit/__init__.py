"""The emitters: one module per generated file, each with the same entry point
``emit(cfg) -> {file name: content}`` over a validated BackendConfig. Fixed C++
lives in codegen/templates/ (rendered by codegen.cpp.render with torchgen's
CodeTemplate); the modules compute what varies.
"""

from __future__ import annotations

from codegen.emit import cpu_kernels, custom_ops, inductor_shims, kernels, native_functions, routes, stubs, structured
from codegen.model import BackendConfig

EMITTERS = (native_functions, kernels, structured, cpu_kernels, stubs, custom_ops, routes, inductor_shims)


def generate(cfg: BackendConfig) -> dict[str, str]:
    """All generated files by name."""
    files: dict[str, str] = {}
    for emitter in EMITTERS:
        files.update(emitter.emit(cfg))
    return files
