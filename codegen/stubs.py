"""The DispatchStubs declared in torch's installed headers.

`DECLARE_DISPATCH(fn_type, name)` in a header under ATen/native declares a stub
that a backend fills with REGISTER_PRIVATEUSE1_DISPATCH (ATen/native/DispatchStub.h).
This module finds every declaration, the namespace it is in, and the parameter
types of its function pointer type, so that the codegen can include the right
header and check a kernel's parameters before the compiler does.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass

from codegen.elf import shared_library

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_TOKEN = re.compile(r"\bnamespace\s+([A-Za-z_][\w:]*)\s*\{|\bnamespace\s*\{|[{}]")
_DECLARE = re.compile(r"\bDECLARE_DISPATCH\s*\(")
_INLINE_FN = re.compile(r"^(.*?)\(\s*\*\s*\)\s*\((.*)\)$", re.S)
_USING_FN = re.compile(r"\busing\s+(\w+)\s*=\s*([^;]*?)\(\s*\*\s*\)\s*\(([^;]*)\)\s*;")
_TYPEDEF_FN = re.compile(r"\btypedef\s+([^;(]*?)\(\s*\*\s*(\w+)\s*\)\s*\(([^;]*)\)\s*;")
_QUALIFIER = re.compile(r"\b(?:at|c10|std)::(?=[A-Za-z_])|\bat::native::")


@dataclass(frozen=True)
class StubDecl:
    name: str  # e.g. "neg_stub"
    namespace: str  # e.g. "at::native"
    fn_type: str  # the function pointer type as spelled, e.g. "unary_fn"
    header: str  # include path, e.g. "ATen/native/UnaryOps.h"
    params: tuple[str, ...] | None  # normalized parameter types; None if unresolved

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def qualified_fn_type(self) -> str:
        return self.fn_type if "::" in self.fn_type else f"{self.namespace}::{self.fn_type}"


def torch_include_dir() -> str:
    """torch/include of the installed torch, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed; the codegen reads its headers")
    return os.path.join(list(spec.submodule_search_locations)[0], "include")


def torch_lib_dir() -> str:
    return os.path.join(os.path.dirname(torch_include_dir()), "lib")


# The static member DECLARE_DISPATCH's DispatchStub holds the CPU kernel in
# (DispatchStub.h), mangled: ..._DECLARE_DISPATCH_typeEE7DEFAULTE.
_CPU_KERNEL_SUFFIX = "_DECLARE_DISPATCH_typeEE7DEFAULTE"


@functools.lru_cache(maxsize=None)
def stubs_with_cpu_kernel(lib_dir: str | None = None) -> frozenset[str]:
    """The stubs libtorch_cpu gives a CPU kernel (REGISTER_DISPATCH in torch's
    build): those whose DEFAULT kernel pointer it defines. A stub that is
    declared but has none in this build (min_elementwise_stub) cannot lend its
    CPU kernel, and its pointer would not even link. Read from the library's
    dynamic symbols."""
    lib = shared_library(os.path.join(lib_dir or torch_lib_dir(), "libtorch_cpu.so"))
    names = lib.dynamic_symbols.defined_matching(rb"\w+" + _CPU_KERNEL_SUFFIX.encode())
    # The stub's name is mangled with its length in front: "...ENS0_30abs_stub".
    return frozenset(
        re.sub(r"^\d+", "", name.decode().removesuffix(_CPU_KERNEL_SUFFIX).rsplit("ENS0_", 1)[-1]) for name in names
    )


def split_params(text: str) -> list[str]:
    """Splits a parameter list at top-level commas."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current))
    return [p.strip() for p in parts]


_TYPE_WORDS = {
    "const", "volatile", "unsigned", "signed", "long", "short", "int", "char", "bool",
    "float", "double", "void", "auto",
}


def normalize_param(param: str) -> str:
    """The type of one parameter with its name, default and namespace
    qualifiers dropped and spacing made canonical: `const at::Scalar& alpha`
    and `const Scalar &` both become `const Scalar&`."""
    param = param.split("=", 1)[0].strip()
    param = _QUALIFIER.sub("", param)
    tokens = re.findall(r"[A-Za-z_]\w*|::|[&*<>,()\[\]]", param)
    # A trailing identifier after a complete type is the parameter's name.
    if len(tokens) >= 2 and re.fullmatch(r"[A-Za-z_]\w*", tokens[-1]) and tokens[-1] not in _TYPE_WORDS:
        if tokens[-2] in ("&", "*", ">") or (
            re.fullmatch(r"[A-Za-z_]\w*", tokens[-2]) and tokens[-2] not in ("const", "volatile", "unsigned", "signed", "struct", "class")
        ):
            tokens = tokens[:-1]
    # `T const&` and `const T&` are the same type.
    if len(tokens) >= 2 and tokens[1] == "const" and tokens[0] != "const":
        tokens = ["const", tokens[0], *tokens[2:]]
    text = ""
    for tok in tokens:
        if text and re.fullmatch(r"\w", text[-1]) and re.fullmatch(r"\w", tok[0]):
            text += " "
        text += tok
    return text


def _namespaces_at(text: str) -> list[tuple[int, str]]:
    """(offset, enclosing namespace) at each brace, for a comment-free header."""
    stack: list[str | None] = []
    marks: list[tuple[int, str]] = []
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        if tok == "}":
            if stack:
                stack.pop()
        elif tok == "{":
            stack.append(None)
        else:
            stack.append(m.group(1) or "")
        marks.append((m.end(), "::".join(s for s in stack if s)))
    return marks


def _namespace_of(marks: list[tuple[int, str]], offset: int) -> str:
    current = ""
    for end, ns in marks:
        if end > offset:
            break
        current = ns
    return current


@functools.lru_cache(maxsize=None)
def declared_stubs(include_dir: str | None = None) -> dict[str, StubDecl]:
    """Every stub declared under ATen/native (quantized ones included), by name."""
    root = include_dir or torch_include_dir()
    native = os.path.join(root, "ATen", "native")
    fn_types: dict[str, tuple[str, ...]] = {}
    raw: list[tuple[str, str, str, str, dict[str, tuple[str, ...]]]] = []
    for dirpath, _, files in os.walk(native):
        for name in sorted(files):
            if not name.endswith(".h"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = _COMMENT.sub("", f.read())
            local: dict[str, tuple[str, ...]] = {}
            for m in _USING_FN.finditer(text):
                local[m.group(1)] = tuple(normalize_param(p) for p in split_params(m.group(3)))
            for m in _TYPEDEF_FN.finditer(text):
                local[m.group(2)] = tuple(normalize_param(p) for p in split_params(m.group(3)))
            fn_types.update(local)
            if "DECLARE_DISPATCH" not in text:
                continue
            marks = _namespaces_at(text)
            header = os.path.relpath(path, root).replace(os.sep, "/")
            for m in _DECLARE.finditer(text):
                args = split_params(_balanced(text, m.end() - 1))
                if len(args) != 2 or args[0] == "fn":  # "fn": the macro's own definition
                    continue
                fn_type, name = (" ".join(a.split()) for a in args)
                raw.append((name, _namespace_of(marks, m.start()), fn_type, header, local))
    stubs = {}
    for name, namespace, fn_type, header, local in raw:
        inline = _INLINE_FN.match(fn_type)
        if inline:  # DECLARE_DISPATCH(void(*)(TensorIterator&), fill_stub)
            params = tuple(normalize_param(p) for p in split_params(inline.group(2)))
        else:
            base = fn_type.split("::")[-1]
            params = local.get(base, fn_types.get(base))
        stubs[name] = StubDecl(name, namespace, fn_type, header, params)
    return stubs


def _balanced(text: str, open_paren: int) -> str:
    """The text inside the parentheses that open at `open_paren`."""
    depth = 0
    for i in range(open_paren, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_paren + 1 : i]
    return ""
