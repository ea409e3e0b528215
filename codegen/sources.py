"""Which functions the hand-written C++ under csrc/ defines.

The codegen checks that every kernel named in backend_functions.yaml has a
definition before it generates code that would otherwise fail only at link or
load time, and compares a stub kernel's parameters with the stub's type.
This is a lexical scan, not a C++ parser: it sees functions defined as
`ret name(params) {`, which is how kernels are written; a kernel produced by a
macro is not seen.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from codegen.stubs import normalize_param, split_params

_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.S)
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")
_AFTER_PARAMS = re.compile(r"\s*(?:const\s*|noexcept\s*|override\s*)*\{")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)
_ENDS_TYPE = re.compile(r"[\w&*>]")
_NOT_A_DEFINITION = {"if", "for", "while", "switch", "return", "sizeof", "catch", "decltype"}
SOURCE_SUFFIXES = (".cpp", ".cc", ".h", ".hpp")


def _definitions_in(text: str) -> dict[str, list[tuple[str, ...]]]:
    text = _COMMENT_OR_STRING.sub(lambda m: " " * len(m.group(0)) if m.group(0).startswith("/") else '""', text)
    found: dict[str, list[tuple[str, ...]]] = {}
    for m in _CALL.finditer(text):
        name = m.group(1)
        if name in _NOT_A_DEFINITION:
            continue
        # A definition's name follows its return type, not an operator or '.'/'->'.
        # Read back from the name in place: a copy of the text before each name
        # would make the scan quadratic in the file's length.
        end = m.start()
        while end and text[end - 1].isspace():
            end -= 1
        if not end or not _ENDS_TYPE.match(text, end - 1) or text.endswith("->", 0, end):
            continue
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        if not _AFTER_PARAMS.match(text, i + 1):
            continue
        params = split_params(text[m.end() : i])
        if params == ["void"]:
            params = []
        found.setdefault(name, []).append(tuple(normalize_param(p) for p in params))
    return found


@dataclass(frozen=True)
class SourceFile:
    path: str
    # Function name -> the normalized parameter types of each definition.
    definitions: dict[str, list[tuple[str, ...]]]
    includes: frozenset[str]  # the file names it #includes ("OpenRegNativeFunctions.h")


def source_files(root: str) -> list[SourceFile]:
    """Every C++ file under `root`, in a stable order."""
    out = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames.sort()
        for name in sorted(files):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            includes = frozenset(os.path.basename(m.group(1)) for m in _INCLUDE.finditer(text))
            out.append(SourceFile(path, _definitions_in(text), includes))
    return out


def defined_functions(sources: list[SourceFile]) -> dict[str, list[tuple[str, ...]]]:
    """Function name -> the normalized parameter types of each definition in `sources`."""
    found: dict[str, list[tuple[str, ...]]] = {}
    for source in sources:
        for fn, sigs in source.definitions.items():
            found.setdefault(fn, []).extend(sigs)
    return found
