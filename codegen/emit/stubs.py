"""RegisterStubs.cpp: the PrivateUse1 kernels of DispatchStubs (routes
`stub_kernel` and `stub_cpu_kernel`)."""

from __future__ import annotations

from codegen import cpp
from codegen.model import BackendConfig, Route, StubEntry

FILE = "RegisterStubs.cpp"


def stub_kernel(cfg: BackendConfig, st: StubEntry) -> str:
    """The function registered for the stub, fully qualified."""
    if st.route is Route.stub_kernel:
        return f"::{cfg.cpp_namespace}::{st.kernel}"
    return f"::{cfg.cpp_namespace}::{cpp.CPU_STUB_KERNEL}<&{st.decl.name}>::run"


def registration(cfg: BackendConfig, st: StubEntry) -> str:
    """The stub's kernel behind a trace scope (TracedStub, OpenRegTrace.h).
    REGISTER_PRIVATEUSE1_DISPATCH names the stub's type unqualified
    (ATen/native/DispatchStub.h), so each registration sits in its stub's
    namespace."""
    site = f"{st.decl.name}_site"
    kernel = stub_kernel(cfg, st)
    traced = f"::openreg::trace::TracedStub<decltype({st.decl.name})::FnPtr>::run<&{site}, &{kernel}>"
    return (
        f'constexpr ::openreg::trace::Site {site}{{"{st.decl.name}", {cpp.route_value(st.route)}, '
        f'"{kernel.removeprefix("::")}"}};\n'
        f"REGISTER_PRIVATEUSE1_DISPATCH({st.decl.name}, (&{traced}))"
    )


def emit(cfg: BackendConfig) -> dict[str, str]:
    if not cfg.stubs:
        return {FILE: cpp.nothing_to_register(cfg, "stubs")}
    by_namespace: dict[str, list[str]] = {}
    for st in cfg.stubs:
        by_namespace.setdefault(st.decl.namespace, []).append(registration(cfg, st))
    openreg_headers = {cpp.TRACE_HEADER}
    if any(st.route is Route.stub_kernel for st in cfg.stubs):
        openreg_headers.add(cpp.NATIVE_HEADER)
    if any(st.route is Route.stub_cpu_kernel for st in cfg.stubs):
        openreg_headers.add(cpp.CPU_ITERATOR_HEADER)
    return {
        FILE: cpp.render(
            FILE,
            cfg,
            stub_headers=cpp.includes({st.decl.header for st in cfg.stubs}, system=True),
            openreg_headers=cpp.includes(openreg_headers, system=False),
            namespaces=[
                f"namespace {ns} {{\n" + "\n".join(regs) + f"\n}} // namespace {ns}\n\n"
                for ns, regs in sorted(by_namespace.items())
            ],
        )
    }
