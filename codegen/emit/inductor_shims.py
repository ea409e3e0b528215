"""InductorCShims.cpp: openreg's C shims for Inductor's C++ wrapper.

Torch generates its C shims (``aoti_torch_cpu_addmm_out`` ...) for the operators
in ``torchgen.aoti.fallback_ops.inductor_fallback_ops`` and each device, calling
that device's kernels directly (``at::cpu::addmm_out``). openreg's call the
dispatcher (``at::addmm_out``): what serves an operator on openreg (a kernel,
CPU kernels on CPU aliases, the fallback) is decided there. The declarations and
bodies are torchgen's (``gen_declaration_and_definition``); this module picks the
operators and writes the lookup table.
"""

from __future__ import annotations

import functools
import re

from torchgen.aoti.fallback_ops import inductor_fallback_ops
from torchgen.gen_aoti_c_shim import gen_declaration_and_definition, gen_static_dispatch_backend_call

from torchgen.model import Variant

from codegen import cpp
from codegen.model import BackendConfig
from codegen.native import native_functions

FILE = "InductorCShims.cpp"
DEVICE = "openreg"
LAUNCH_HEADER = "compiler/OpenRegInductorLaunch.h"
HOST_KERNEL_HEADER = "operators/OpenRegLaunch.h"  # openreg_launch_host_kernel


@functools.lru_cache(maxsize=None)
def shims() -> list[tuple[str, str, list[str]]]:
    """(operator header, definitions, shim names) per operator torchgen can shim."""
    functions = native_functions()
    out = []
    for name, version_info in sorted(inductor_fallback_ops.items()):
        overload = name.removeprefix("aten.").removesuffix(".default")
        f = functions.get(overload)
        if f is None:
            continue
        # at::<op> exists for operators with a function variant; the few
        # method-only ones (bernoulli_, set_, view, to_sparse, resize_) are
        # called through their dispatcher entry, whose arguments are the
        # schema's, in the shim's order.
        if Variant.function in f.variants:
            call = gen_static_dispatch_backend_call(f, None)
        else:
            call = f"at::_ops::{f.func.name.unambiguous_name()}::call"
        try:
            declarations, definitions = gen_declaration_and_definition(f.func, DEVICE, call, version_info)
        except NotImplementedError:  # an argument type torchgen's shims do not take
            continue
        names = re.findall(rf"\b(aoti_torch_{DEVICE}_\w+)\(", declarations)
        out.append((f"ATen/ops/{f.root_name}.h", definitions, names))
    return out


def emit(cfg: BackendConfig) -> dict[str, str]:
    rows = shims()
    return {
        FILE: cpp.render(
            FILE,
            cfg,
            operator_headers=cpp.includes([header for header, _, _ in rows], system=True),
            launch_header=LAUNCH_HEADER,
            host_kernel_header=HOST_KERNEL_HEADER,
            definitions=[definitions for _, definitions, _ in rows],
            table=[
                f'{{"{name}", reinterpret_cast<void*>(&{name})}},' for _, _, names in rows for name in names
            ],
        )
    }
