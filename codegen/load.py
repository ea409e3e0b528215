"""Reads backend_functions.yaml into a BackendConfig, or raises YamlError.

All checking happens here, before anything is generated: an emitter never sees
an entry that is not a resolved, well-typed operator binding.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Callable, Iterable

import yaml

from codegen.cpp import NATIVE_HEADER
from codegen.model import (
    BackendConfig,
    CpuKernelEntry,
    CustomOp,
    FallbackPolicy,
    KernelEntry,
    Location,
    OpRef,
    Route,
    StructuredEntry,
    StubEntry,
    YamlError,
)
from codegen.native import (
    cpu_kernel,
    has_cpu_kernel,
    native_functions,
    nested_kernels_behind_composites,
    sparse_kernels_behind_composites,
    structured_groups,
)
from codegen.sources import defined_functions, source_files
from codegen.stub_calls import impl_stub_calls
from codegen.stubs import StubDecl, declared_stubs, stubs_with_cpu_kernel
from torchgen.model import (
    BaseTy,
    BaseType,
    DeviceCheckType,
    NativeFunction,
    NativeFunctionsGroup,
    OptionalType,
    SchemaKind,
)
from torchgen.model import Location as TorchgenLocation

LINE = "__line__"
KEY_LINES = "__key_lines__"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*\Z")

TOP_LEVEL_KEYS = ("cpp_namespace", "kernels", "structured", "cpu_kernels", "stubs", "custom_ops", "fallback")
CPU_KERNEL_KEYS = ("op",)
KERNEL_KEYS = ("op", "kernel", "symint", "device_guard", "device_check", "handles_conj_neg", "autograd")
FALLBACK_KEYS = ("global", "nested", "sparse", "ops", "blocklist", "cpu_tensor_args", "cpu_results")
OP_REF_KEYS = ("op",)
STRUCTURED_KEYS = ("op", "impl", "on_cpu_aliases")
STUBS_KEYS = ("cpu_kernels", "kernels")
STUB_KEYS = ("stub", "kernel")
# Keys an earlier format of the file used, and what replaced them.
RENAMED = {
    "host_impl": "'host_impl' is now 'on_cpu_aliases' (CPU's impl() on CPU aliases of the tensors): rename the key",
    "cpu_kernel": "stubs no longer take 'cpu_kernel: true': with 'stubs.cpu_kernels: true' every stub that takes a "
    "TensorIterator runs CPU's kernel on device memory unless 'stubs.kernels' names an openreg kernel for it; "
    "remove the entry",
}
CUSTOM_OP_KEYS = ("schema", "kernel", "meta", "backward")
CUSTOM_NAMESPACE = "openreg"
# Argument types a generated autograd function can keep for the backward besides
# tensors (stored as IValues in AutogradContext::saved_data).
_SAVABLE = {BaseTy.Scalar, BaseTy.int, BaseTy.SymInt, BaseTy.float, BaseTy.bool}
BLOCKED_KEYS = ("op", "reason")


class _Loader(yaml.SafeLoader):
    """Records the line of every mapping and of each of its keys; rejects repeated keys."""

    filename = "<yaml>"

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        key_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if not isinstance(key, (str, int, float, bool, type(None))):
                # `? [a, b]` or `? {a: 1}`: a list or mapping as a key (unhashable,
                # and never one of the file's keys).
                raise YamlError(
                    Location(self.filename, line),
                    f"a key must be a plain word such as 'op', got {_kind(key)}",
                )
            if key in key_lines:
                raise YamlError(
                    Location(self.filename, line),
                    f"key '{key}' appears twice in this mapping (first on line {key_lines[key]}); "
                    "keep one of them",
                )
            key_lines[key] = line
        mapping = super().construct_mapping(node, deep=deep)
        mapping[LINE] = node.start_mark.line + 1
        mapping[KEY_LINES] = key_lines
        return mapping


def _suggest(word: str, choices: list[str] | tuple[str, ...], n: int = 3) -> str:
    close = difflib.get_close_matches(word, choices, n=n, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


class _Reader:
    def __init__(self, path: str, csrc_dir: str | None) -> None:
        self.path = path
        self.csrc_dir = csrc_dir
        self.natives = native_functions()

    def loc(self, line: int) -> Location:
        return Location(self.path, line)

    def key_loc(self, mapping: dict[str, Any], key: str) -> Location:
        return self.loc(mapping[KEY_LINES].get(key, mapping[LINE]))

    # -- structure -----------------------------------------------------------

    def mapping(self, value: Any, line: int, what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise YamlError(
                self.loc(line), f"{what} must be a mapping of keys to values, got {_kind(value)}"
            )
        return value

    def check_keys(self, mapping: dict[str, Any], allowed: tuple[str, ...], what: str) -> None:
        for key in mapping[KEY_LINES]:
            if key not in allowed and key in RENAMED:
                raise YamlError(self.key_loc(mapping, key), f"in {what}: {RENAMED[key]}")
            if key not in allowed:
                raise YamlError(
                    self.key_loc(mapping, key),
                    f"unknown key '{key}' in {what}.{_suggest(str(key), allowed)} "
                    f"Allowed keys: {', '.join(allowed)}.",
                )

    def get(
        self,
        mapping: dict[str, Any],
        key: str,
        kind: type,
        what: str,
        default: Any = None,
        required: bool = False,
    ) -> Any:
        if key not in mapping:
            if required:
                raise YamlError(
                    self.loc(mapping[LINE]), f"{what} needs the key '{key}'"
                )
            return default
        value = mapping[key]
        # bool is a subclass of int in Python, so check it exactly.
        ok = type(value) is bool if kind is bool else isinstance(value, kind)
        if not ok:
            raise YamlError(
                self.key_loc(mapping, key),
                f"'{key}' in {what} must be {_kind_name(kind)}, got {_kind(value)}",
            )
        return value

    def items(self, mapping: dict[str, Any], key: str, what: str) -> list[tuple[dict[str, Any], int]]:
        value = self.get(mapping, key, list, what, default=[])
        line = mapping[KEY_LINES].get(key, mapping[LINE])
        return [(self.mapping(v, line, f"each entry of '{key}'"), line) for v in value]

    # -- operators -----------------------------------------------------------

    def operator(self, entry: dict[str, Any], what: str) -> NativeFunction:
        name = self.get(entry, "op", str, what, required=True).strip()
        f = self.natives.get(name)
        if f is None:
            overloads = sorted(n for n in self.natives if n.split(".")[0] == name)
            if overloads:
                hint = " Name an overload: " + ", ".join(overloads[:6]) + "."
            else:
                hint = _suggest(name, list(self.natives))
            raise YamlError(
                self.key_loc(entry, "op"),
                f"unknown operator '{name}': no such aten operator in torch's native_functions.yaml."
                f"{hint} Use the overload name as it appears there (e.g. 'add.Tensor').",
            )
        return f

    def function_name(self, entry: dict[str, Any], key: str, what: str, required: bool = True) -> str:
        name = self.get(entry, key, str, what, required=required)
        if name is not None and not _IDENTIFIER.match(name):
            raise YamlError(
                self.key_loc(entry, key),
                f"{key} '{name}' is not a C++ function name; give the bare name of a "
                "function in cpp_namespace",
            )
        return name

    # -- sections ------------------------------------------------------------

    def kernels(self, top: dict[str, Any]) -> tuple[KernelEntry, ...]:
        out: list[KernelEntry] = []
        for entry, _ in self.items(top, "kernels", "the file"):
            what = "a kernels entry"
            self.check_keys(entry, KERNEL_KEYS, what)
            f = self.operator(entry, what)
            kernel = self.function_name(entry, "kernel", what)
            out.append(
                KernelEntry(
                    func=f,
                    kernel=kernel,
                    symint=self.get(entry, "symint", bool, what, default=False),
                    device_guard=self.get(entry, "device_guard", bool, what, default=f.device_guard),
                    device_check=self.get(
                        entry,
                        "device_check",
                        bool,
                        what,
                        default=f.device_check == DeviceCheckType.ExactSame,
                    ),
                    handles_conj_neg=self.get(entry, "handles_conj_neg", bool, what, default=False),
                    autograd=self.autograd_kernel(entry, f, what),
                    loc=self.loc(entry[LINE]),
                )
            )
        return tuple(out)

    def autograd_kernel(self, entry: dict[str, Any], f: NativeFunction, what: str) -> bool:
        autograd = self.get(entry, "autograd", bool, what, default=False)
        if autograd and not f.has_composite_implicit_autograd_kernel:
            raise YamlError(
                self.key_loc(entry, "autograd"),
                f"'{f.func.name}' has no CompositeImplicitAutograd kernel: autograd: true registers the "
                "kernel under AutogradPrivateUse1 in place of such a kernel. Operators with an autograd "
                "formula of their own take a plain kernel (remove autograd).",
            )
        return autograd

    def structured(self, top: dict[str, Any]) -> tuple[StructuredEntry, ...]:
        out = []
        groups = structured_groups()
        for entry, _ in self.items(top, "structured", "the file"):
            what = "a structured entry"
            self.check_keys(entry, STRUCTURED_KEYS, what)
            f = self.operator(entry, what)
            name = str(f.func.name)
            g = groups.get(name)
            if g is None:
                base = f.func.name.name.base
                ours = sorted(n for n, gg in groups.items() if gg.root_name == f.root_name)
                if f.structured_delegate is not None:
                    hint = f" It delegates to the structured '{f.structured_delegate}': name that instead."
                elif ours:
                    hint = f" Structured operators named {base}: {', '.join(ours)}."
                else:
                    hint = f" No operator named {base} is structured: bind it under 'kernels' or let the fallback run it."
                raise YamlError(
                    self.key_loc(entry, "op"),
                    f"'{name}' is not the out= operator of a structured group in torch's "
                    f"native_functions.yaml.{hint}",
                )
            if g.mutable is not None:
                raise YamlError(
                    self.key_loc(entry, "op"),
                    f"'{name}' has a mutable variant, which structured kernels do not support; bind it under 'kernels'",
                )
            impl = self.function_name(entry, "impl", what, required=False)
            on_aliases = self.get(entry, "on_cpu_aliases", bool, what, default=False)
            kernel = cpu_kernel(g)
            if impl is None and (kernel is None or not kernel.structured):
                raise YamlError(
                    self.key_loc(entry, "op"),
                    f"'{name}' has no structured CPU kernel whose class openreg could reuse; give it an openreg "
                    "'impl' or bind it under 'kernels'",
                )
            if on_aliases and impl is not None:
                raise YamlError(
                    self.key_loc(entry, "on_cpu_aliases"),
                    f"'{name}' names an openreg 'impl', which takes device tensors; 'on_cpu_aliases' runs CPU's "
                    "impl() on CPU aliases instead: give one of the two",
                )
            if on_aliases:
                self.check_alias_arguments(entry, g)
            route = Route.structured_impl if impl else Route.structured_on_cpu_aliases if on_aliases else Route.structured
            out.append(StructuredEntry(group=g, cpu_kernel=kernel, loc=self.loc(entry[LINE]), route=route, impl=impl))
        return tuple(out)

    def check_alias_arguments(self, entry: dict[str, Any], g: NativeFunctionsGroup) -> None:
        """An on_cpu_aliases wrapper gives impl() a CPU alias for each Tensor
        argument; optional tensors and tensor lists have no alias to give."""
        for f in g.functions():
            for a in f.func.arguments.flat_all:
                if a.type.is_tensor_like() and a.type != BaseType(BaseTy.Tensor):
                    raise YamlError(
                        self.key_loc(entry, "on_cpu_aliases"),
                        f"'on_cpu_aliases' gives impl() CPU aliases of Tensor arguments only, but {f.func.name} takes "
                        f"'{a.name}' of type {a.type}: give the group an openreg 'impl' or bind it under 'cpu_kernels'",
                    )

    def cpu_kernels(self, top: dict[str, Any], policy: FallbackPolicy) -> tuple[CpuKernelEntry, ...]:
        out = []
        accepting = {str(r.name) for r in policy.cpu_tensor_args}
        for entry, _ in self.items(top, "cpu_kernels", "the file"):
            what = "a cpu_kernels entry"
            self.check_keys(entry, CPU_KERNEL_KEYS, what)
            f = self.operator(entry, what)
            name = str(f.func.name)
            loc = self.key_loc(entry, "op")
            if not has_cpu_kernel(f):
                why = (
                    "it is CompositeImplicitAutograd: it runs through other operators and needs no kernel"
                    if f.has_composite_implicit_autograd_kernel
                    else "torch has no CPU kernel for it"
                )
                raise YamlError(loc, f"'{name}' cannot run a CPU kernel on openreg: {why}; remove the entry")
            for a in f.func.arguments.flat_all:
                if a.type.is_list_like() and a.is_write:
                    raise YamlError(
                        loc,
                        f"'{name}' writes the tensor list '{a.name}', which cpu_kernels entries do not "
                        "support; leave it to the fallback",
                    )
                base = a.type.elem if isinstance(a.type, OptionalType) else a.type
                if isinstance(base, BaseType) and base.name == BaseTy.Storage:
                    raise YamlError(
                        loc, f"'{name}' takes a Storage ('{a.name}'); bind it under 'kernels' or leave it to the fallback"
                    )
            for r in f.func.returns:
                if r.annotation is not None and not r.annotation.is_write:
                    raise YamlError(
                        loc,
                        f"'{name}' returns a view of its input; view operators need a kernel that builds the "
                        "view (bind it under 'kernels'), not a CPU kernel",
                    )
            out.append(CpuKernelEntry(func=f, accepts_cpu_tensors=name in accepting, loc=self.loc(entry[LINE])))
        return tuple(out)

    def stubs(self, top: dict[str, Any]) -> tuple[StubEntry, ...]:
        """The yaml's openreg stub kernels, then (with cpu_kernels) CPU's
        kernel for every other stub that can run on device memory."""
        if "stubs" not in top:
            return ()
        line = self.key_loc(top, "stubs").line
        if isinstance(top["stubs"], list):
            raise YamlError(
                self.loc(line),
                "'stubs' is a mapping: 'cpu_kernels: true' (CPU's kernel for every stub that takes a "
                "TensorIterator) and 'kernels:', a list of {stub, kernel} entries naming openreg kernels; "
                "see docs/backend_functions.md",
            )
        section = self.mapping(top["stubs"], line, "'stubs'")
        self.check_keys(section, STUBS_KEYS, "stubs")
        declared = declared_stubs()
        out = []
        for entry, _ in self.items(section, "kernels", "stubs"):
            what = "a stubs.kernels entry"
            self.check_keys(entry, STUB_KEYS, what)
            name = self.get(entry, "stub", str, what, required=True).strip()
            decl = declared.get(name.split("::")[-1])
            if decl is None:
                raise YamlError(
                    self.key_loc(entry, "stub"),
                    f"unknown stub '{name}': no DECLARE_DISPATCH of that name in torch's headers "
                    f"(torch/include/ATen/native).{_suggest(name, list(declared))} "
                    "Give the stub's name as declared, e.g. 'neg_stub'.",
                )
            kernel = self.function_name(entry, "kernel", what)
            out.append(StubEntry(decl=decl, kernel=kernel, loc=self.loc(entry[LINE]), route=Route.stub_kernel))
        if self.get(section, "cpu_kernels", bool, "stubs", default=False):
            loc = self.key_loc(section, "cpu_kernels")
            named = {st.decl.name for st in out}
            out += [
                StubEntry(decl=decl, kernel=None, loc=loc, route=Route.stub_cpu_kernel)
                for name, decl in sorted(declared.items())
                if name not in named and cpu_kernel_runs_on_device_memory(decl)
            ]
        return tuple(out)

    def check_structured_stubs(self, cfg: BackendConfig) -> None:
        """A structured group whose CPU impl() runs on the device tensors
        reaches the device through the stubs that impl() calls: each needs a
        PrivateUse1 kernel, or torch's DispatchStub fails at run time with
        "missing kernel for openreg"."""
        served = {st.decl.name for st in cfg.stubs}
        for s in cfg.structured:
            if s.route is not Route.structured:
                continue
            for decl in stubs_called_by(s):
                if decl.name in served:
                    continue
                called = f"'{s.name}': CPU's impl() calls {decl.qualified_name} ({decl.header})"
                if cpu_kernel_runs_on_device_memory(decl):
                    raise YamlError(
                        s.loc,
                        f"{called}, which has no openreg kernel: set 'cpu_kernels: true' under 'stubs' (CPU's "
                        f"kernel of every stub that takes a TensorIterator, on device memory) or add "
                        f"'- {{stub: {decl.name}, kernel: ...}}' under stubs.kernels",
                    )
                raise YamlError(
                    s.loc,
                    f"{called}, which {_why_not_cpus_kernel(decl)}, so it needs an openreg kernel: add "
                    f"'- {{stub: {decl.name}, kernel: ...}}' under stubs.kernels (a function in {cfg.cpp_namespace} "
                    "with the stub's parameter types), give the group an openreg 'impl', or run CPU's impl() on "
                    "CPU aliases with 'on_cpu_aliases: true'",
                )

    def custom_ops(self, top: dict[str, Any]) -> tuple[CustomOp, ...]:
        out = []
        for entry, _ in self.items(top, "custom_ops", "the file"):
            what = "a custom_ops entry"
            self.check_keys(entry, CUSTOM_OP_KEYS, what)
            schema = self.get(entry, "schema", str, what, required=True).strip()
            loc = self.key_loc(entry, "schema")
            if "::" in schema.split("(")[0]:
                raise YamlError(
                    loc,
                    f"write the schema without a namespace: custom operators live in '{CUSTOM_NAMESPACE}::' "
                    f"(e.g. 'my_op(Tensor self) -> Tensor')",
                )
            try:
                func, _ = NativeFunction.from_yaml(
                    {"func": f"{CUSTOM_NAMESPACE}::{schema}"}, TorchgenLocation(self.path, loc.line), set()
                )
            except Exception as e:  # torchgen reports schema errors as AssertionError/RuntimeError
                raise YamlError(
                    loc,
                    f"invalid operator schema '{schema}': {str(e).splitlines()[0] if str(e) else type(e).__name__}. "
                    "Write it as in native_functions.yaml, e.g. 'my_op(Tensor self, *, Scalar alpha=1) -> Tensor'",
                ) from None
            out.append(
                CustomOp(
                    func=func,
                    kernel=self.function_name(entry, "kernel", what),
                    meta=self.function_name(entry, "meta", what),
                    backward=self.get(entry, "backward", str, what),
                    loc=self.loc(entry[LINE]),
                )
            )
        ops = tuple(out)
        self.check_custom_ops(ops)
        return ops

    def check_custom_ops(self, ops: tuple[CustomOp, ...]) -> None:
        repeated = _repeated((str(op.name), op.loc) for op in ops)
        if repeated:
            (key, first), (_, again) = repeated
            raise YamlError(again, f"custom operator '{key}' is declared twice (also line {first.line}); keep one")
        by_name = {str(op.name): op for op in ops}
        for op in ops:
            if op.backward is not None:
                self.check_backward(op, by_name)

    def check_backward(self, op: CustomOp, by_name: dict[str, CustomOp]) -> None:
        """The backward op's arguments are matched by name: `grad` is the
        gradient of the result, `result` the forward's result, any other name a
        forward argument; it returns one gradient per Tensor argument."""
        schema = op.func.func
        bwd = by_name.get(op.backward)
        if bwd is None:
            raise YamlError(
                op.loc,
                f"backward '{op.backward}' of '{op.name}' is not a custom operator in this file."
                f"{_suggest(op.backward, list(by_name))} Declare it under custom_ops with its own schema.",
            )
        if schema.kind() is not SchemaKind.functional or len(schema.returns) != 1 or not schema.returns[0].type.is_tensor_like():
            raise YamlError(
                op.loc,
                f"'{op.name}' has a backward, so it must be functional and return one Tensor; "
                f"its schema returns ({', '.join(str(r.type) for r in schema.returns)})",
            )
        forward_args = {a.name: a for a in schema.arguments.flat_all}
        for a in bwd.func.func.arguments.flat_all:
            if a.name in ("grad", "result"):
                if str(a.type) != "Tensor":
                    raise YamlError(bwd.loc, f"argument '{a.name}' of backward '{bwd.name}' must be a Tensor")
                continue
            fa = forward_args.get(a.name)
            if fa is None:
                raise YamlError(
                    bwd.loc,
                    f"argument '{a.name}' of backward '{bwd.name}' is neither 'grad', 'result' nor an argument of "
                    f"'{op.name}' ({', '.join(forward_args)}); the backward's arguments are matched by name",
                )
            if fa.type != a.type:
                raise YamlError(
                    bwd.loc,
                    f"argument '{a.name}' of backward '{bwd.name}' is {a.type} but {fa.type} in '{op.name}'",
                )
            base = fa.type.elem if isinstance(fa.type, OptionalType) else fa.type
            if not fa.type.is_tensor_like() and not (isinstance(base, BaseType) and base.name in _SAVABLE):
                raise YamlError(
                    bwd.loc,
                    f"backward '{bwd.name}' needs '{a.name}' of type {fa.type}, which the generated autograd "
                    "function cannot save; only Tensors and int, SymInt, float, bool and Scalar values (optional or not) can be saved",
                )
        tensors = [a for a in schema.arguments.flat_all if a.type.is_tensor_like()]
        returns = bwd.func.func.returns
        if len(returns) != len(tensors) or any(str(r.type) != "Tensor" for r in returns):
            raise YamlError(
                bwd.loc,
                f"backward '{bwd.name}' must return one Tensor per Tensor argument of '{op.name}' "
                f"({', '.join(a.name for a in tensors)}): {len(tensors)} Tensors, got "
                f"({', '.join(str(r.type) for r in returns)})",
            )

    def check_definitions(self, cfg: BackendConfig) -> None:
        """Every kernel the yaml names is defined under csrc/, and a stub
        kernel's parameters have the stub's types."""
        named: list[tuple[str, Location]] = [(k.kernel, k.loc) for k in cfg.kernels]
        named += [(n, c.loc) for c in cfg.custom_ops for n in (c.kernel, c.meta)]
        named += [(st.kernel, st.loc) for st in cfg.stubs if st.kernel is not None]
        named += [(s.impl, s.loc) for s in cfg.structured if s.impl is not None]
        if self.csrc_dir is None or not named:
            return
        if not os.path.isdir(self.csrc_dir):
            raise YamlError(
                named[0][1],
                f"the kernel source directory {self.csrc_dir} does not exist: the codegen checks that "
                "every kernel the yaml names is defined there; pass --csrc-dir",
            )
        sources = source_files(self.csrc_dir)
        defined = defined_functions(sources)
        for name, loc in named:
            if name not in defined:
                raise YamlError(
                    loc,
                    f"kernel '{name}' is not defined in any file under {self.csrc_dir}; write "
                    f"'{name}' in namespace {cfg.cpp_namespace} (the generated {NATIVE_HEADER} declares it) "
                    "or fix the name",
                )
            # The header makes a definition without a declaration before it a
            # compile error (codegen/templates/OpenRegNativeFunctions.h).
            files = [f for f in sources if name in f.definitions]
            if not any(NATIVE_HEADER in f.includes for f in files):
                raise YamlError(
                    loc,
                    f"kernel '{name}' is defined in {os.path.relpath(files[0].path, self.csrc_dir)}, which does not "
                    f"include the generated {NATIVE_HEADER}: include it there, so that the compiler checks the "
                    "definition against the declaration the registrations call (with other parameter types it "
                    "would be another function, and the extension would fail to load)",
                )
        for st in cfg.stubs:
            want = st.decl.params
            if want is None or st.kernel is None:
                continue
            have = defined[st.kernel]
            if tuple(want) not in have:
                got = " or ".join("(" + ", ".join(p) + ")" for p in have)
                raise YamlError(
                    st.loc,
                    f"kernel '{st.kernel}' cannot serve '{st.decl.name}': the stub's type {st.decl.fn_type} "
                    f"({st.decl.header}) takes ({', '.join(want)}) but '{st.kernel}' takes {got}; "
                    "give the kernel exactly the stub's parameter types",
                )

    def op_refs(self, section: dict[str, Any], key: str, keys: tuple[str, ...], reason: bool) -> tuple[OpRef, ...]:
        out = []
        for entry, _ in self.items(section, key, "fallback"):
            what = f"a fallback.{key} entry"
            self.check_keys(entry, keys, what)
            f = self.operator(entry, what)
            text = None
            if reason:
                text = self.get(entry, "reason", str, what, required=True).strip()
                if not text:
                    raise YamlError(
                        self.key_loc(entry, "reason"),
                        "the reason of a blocked operator is shown in its error; write one",
                    )
            out.append(OpRef(func=f, loc=self.loc(entry[LINE]), reason=text))
        return tuple(out)

    def fallback(self, top: dict[str, Any]) -> FallbackPolicy:
        if "fallback" not in top:
            return FallbackPolicy(
                enabled=True,
                ops=(),
                blocklist=(),
                cpu_tensor_args=(),
                nested_ops=nested_kernels_behind_composites(),
                sparse_ops=sparse_kernels_behind_composites(False),
                sparse_compressed_ops=sparse_kernels_behind_composites(True),
            )
        section = self.mapping(top["fallback"], self.key_loc(top, "fallback").line, "'fallback'")
        self.check_keys(section, FALLBACK_KEYS, "fallback")
        enabled = self.get(section, "global", bool, "fallback", default=True)
        nested = self.get(section, "nested", bool, "fallback", default=enabled)
        if nested and not enabled:
            # The operators that make a nested tensor from dense ones
            # (_nested_tensor_from_mask, _nested_from_padded, _nested_view_from_buffer)
            # have no openreg kernel: they reach nested tensors through the global fallback.
            raise YamlError(
                self.key_loc(section, "nested"),
                "'nested: true' needs 'global: true': the operators that make nested tensors from dense "
                "ones run on the global CPU fallback; set 'global: true', or 'nested: false' to refuse "
                "nested tensors of the strided layout",
            )
        sparse = self.get(section, "sparse", bool, "fallback", default=enabled)
        if sparse and not enabled:
            # to_sparse and the other operators that make sparse tensors from
            # dense ones have no openreg kernel: they run on the global fallback.
            raise YamlError(
                self.key_loc(section, "sparse"),
                "'sparse: true' needs 'global: true': the operators that make sparse tensors from dense "
                "ones (to_sparse) run on the global CPU fallback; set 'global: true', or 'sparse: false' to "
                "refuse sparse tensors",
            )
        blocklist = self.op_refs(section, "blocklist", BLOCKED_KEYS, reason=True)
        blocked = {r.name for r in blocklist}

        def sparse_ops(compressed: bool) -> tuple:
            # A blocked operator stays blocked on sparse tensors too (its
            # composite kernel reaches the blocked dense kernel, or raises).
            if not sparse:
                return ()
            return tuple(f for f in sparse_kernels_behind_composites(compressed) if f.func.name not in blocked)

        return FallbackPolicy(
            enabled=enabled,
            sparse=sparse,
            sparse_ops=sparse_ops(False),
            sparse_compressed_ops=sparse_ops(True),
            ops=self.op_refs(section, "ops", OP_REF_KEYS, reason=False),
            blocklist=blocklist,
            cpu_tensor_args=self.op_refs(section, "cpu_tensor_args", OP_REF_KEYS, reason=False),
            nested=nested,
            cpu_results=self.op_refs(section, "cpu_results", OP_REF_KEYS, reason=False),
            nested_ops=nested_kernels_behind_composites() if nested else (),
        )

    def config(self, top: Any) -> BackendConfig:
        top = self.mapping(top, 1, "the file")
        self.check_keys(top, TOP_LEVEL_KEYS, "the file")
        namespace = self.get(top, "cpp_namespace", str, "the file", required=True)
        if not _NAMESPACE.match(namespace):
            raise YamlError(
                self.key_loc(top, "cpp_namespace"),
                f"cpp_namespace '{namespace}' is not a C++ namespace such as 'openreg::native'",
            )
        policy = self.fallback(top)
        cfg = BackendConfig(
            source=self.path,
            cpp_namespace=namespace,
            kernels=self.kernels(top),
            fallback=policy,
            cpu_kernels=self.cpu_kernels(top, policy),
            structured=self.structured(top),
            stubs=self.stubs(top),
            custom_ops=self.custom_ops(top),
            custom_namespace=CUSTOM_NAMESPACE,
        )
        self.check_unique(cfg)
        self.check_structured_stubs(cfg)
        self.check_definitions(cfg)
        return cfg

    def check_unique(self, cfg: BackendConfig) -> None:
        """An operator is bound one way only."""
        groups: list[tuple[str, list[tuple[Any, Location]]]] = [
            ("kernels", [(k.name, k.loc) for k in cfg.kernels]),
            ("structured", [(f.func.name, s.loc) for s in cfg.structured for f in s.functions()]),
            ("cpu_kernels", [(c.name, c.loc) for c in cfg.cpu_kernels]),
            ("fallback.ops", [(r.name, r.loc) for r in cfg.fallback.ops]),
            ("fallback.blocklist", [(r.name, r.loc) for r in cfg.fallback.blocklist]),
        ]
        repeated = _repeated(
            (str(name), (section, loc)) for section, entries in groups for name, loc in entries
        )
        if repeated:
            (key, (first_section, first)), (_, (_, again)) = repeated
            raise YamlError(
                again,
                f"'{key}' is already bound in {first_section} at line {first.line}; "
                "an operator has one binding: remove one of the entries",
            )
        repeated = _repeated((st.decl.name, st.loc) for st in cfg.stubs if st.route is Route.stub_kernel)
        if repeated:
            (name, first), (_, again) = repeated
            raise YamlError(
                again, f"stub '{name}' already has a kernel at line {first.line}; a stub has one PrivateUse1 kernel"
            )
        for section, refs in (("cpu_tensor_args", cfg.fallback.cpu_tensor_args), ("cpu_results", cfg.fallback.cpu_results)):
            repeated = _repeated((str(r.name), r.loc) for r in refs)
            if repeated:
                (key, first), (_, again) = repeated
                raise YamlError(again, f"'{key}' is listed twice in fallback.{section} (also line {first.line})")


_ITERATORS = ("TensorIteratorBase&", "TensorIterator&")


def cpu_kernel_runs_on_device_memory(decl: StubDecl) -> bool:
    """Whether CPU's kernel of a stub can serve openreg (Route.stub_cpu_kernel)."""
    return _why_not_cpus_kernel(decl) is None


def _why_not_cpus_kernel(decl: StubDecl) -> str | None:
    """Why CPU's kernel of a stub cannot serve openreg, or None when it can:
    libtorch_cpu has one, it takes a TensorIterator, whose operands openreg
    points at kernel addresses, and no Generator (CPU's kernel would draw from
    CPU's generator, not the device's). Quantized stubs are left out: openreg
    has no quantized tensors."""
    params = decl.params
    if params is None:
        return f"has a type the codegen cannot read ({decl.fn_type})"
    if not params or params[0] not in _ITERATORS:
        return f"takes ({', '.join(params)}) rather than a TensorIterator"
    if any("Generator" in p for p in params):
        return "takes a Generator (CPU's kernel would draw from CPU's generator)"
    if "/quantized/" in decl.header:
        return "is a quantized stub"
    if decl.name not in stubs_with_cpu_kernel():
        return "has no CPU kernel in this build of torch"
    return None


def stubs_called_by(s: StructuredEntry) -> list[StubDecl]:
    """The stubs CPU's impl() of a structured group calls, read from
    libtorch_cpu's machine code (codegen/stub_calls.py). Where it cannot be
    read (not x86-64), the stubs named after the group (`cumsum_stub`,
    `sort_stub`, `avg_pool2d_kernel`) that take tensors rather than an
    iterator: what torch's naming tells, which misses linalg_cross's
    cross_stub."""
    declared = declared_stubs()
    calls = impl_stub_calls()
    if calls is not None and s.parent_class in calls:
        return [declared[name] for name in sorted(calls[s.parent_class])]
    root = s.group.root_name.lstrip("_")
    named = [declared.get(f"{root}_stub"), declared.get(f"{root}_kernel")]
    return [
        d
        for d in named
        if d is not None
        and d.name in stubs_with_cpu_kernel()  # one torch uses
        and not (d.params and d.params[0] in _ITERATORS)
        and "/quantized/" not in d.header
    ]


def _repeated(entries: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], tuple[str, Any]] | None:
    """The first (key, value) whose key an earlier entry has, with that earlier
    entry: (earlier, repeat); None when the keys are unique."""
    seen: dict[str, tuple[str, Any]] = {}
    for entry in entries:
        if entry[0] in seen:
            return seen[entry[0]], entry
        seen[entry[0]] = entry
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, (set, frozenset)):
        return "a set"
    if type(value) is bool:
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string '{value}'"
    # YAML's other types: !!binary, dates and timestamps, !!set, ...
    return f"the {type(value).__name__} {value!r}"


def _kind_name(kind: type) -> str:
    return {bool: "true or false", str: "a string", list: "a list", dict: "a mapping"}.get(
        kind, kind.__name__
    )


def load_text(text: str, path: str, csrc_dir: str | None = None) -> BackendConfig:
    """Parses and validates yaml text; `path` is used for locations only."""
    if not text.strip() or all(
        not line.strip() or line.lstrip().startswith("#") for line in text.splitlines()
    ):
        raise YamlError(
            Location(path, 1),
            "the file is empty; it needs at least 'cpp_namespace' (see docs/backend_functions.md)",
        )
    loader_cls: Callable[..., Any] = type("_BoundLoader", (_Loader,), {"filename": path})
    try:
        data = yaml.load(text, Loader=loader_cls)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise YamlError(Location(path, line), f"invalid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise YamlError(Location(path, 1), f"invalid YAML: {e}") from None
    return _Reader(path, csrc_dir).config(data)


def load(path: str, csrc_dir: str | None = None) -> BackendConfig:
    """Reads and validates `path`. With `csrc_dir`, every kernel the yaml names
    must be defined by a file under it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise YamlError(Location(path, 0), f"cannot read the file: {e.strerror}") from None
    return load_text(text, path, csrc_dir)
