"""Reads backend_functions.yaml into a BackendConfig, or raises YamlError.

All checking happens here, before anything is generated: an emitter never sees
an entry that is not a resolved, well-typed operator binding.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable

import yaml

from codegen.model import (
    BackendConfig,
    FallbackPolicy,
    KernelEntry,
    Location,
    OpRef,
    YamlError,
)
from codegen.native import native_functions
from torchgen.model import DeviceCheckType, NativeFunction

LINE = "__line__"
KEY_LINES = "__key_lines__"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*\Z")

TOP_LEVEL_KEYS = ("cpp_namespace", "kernels", "fallback")
KERNEL_KEYS = ("op", "kernel", "symint", "device_guard", "device_check", "handles_conj_neg")
FALLBACK_KEYS = ("global", "ops", "blocklist", "cpu_tensor_args")
OP_REF_KEYS = ("op",)
BLOCKED_KEYS = ("op", "reason")


class _Loader(yaml.SafeLoader):
    """Records the line of every mapping and of each of its keys; rejects repeated keys."""

    filename = "<yaml>"

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        key_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
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
    def __init__(self, path: str) -> None:
        self.path = path
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

    # -- sections ------------------------------------------------------------

    def kernels(self, top: dict[str, Any]) -> tuple[KernelEntry, ...]:
        out: list[KernelEntry] = []
        for entry, _ in self.items(top, "kernels", "the file"):
            what = "a kernels entry"
            self.check_keys(entry, KERNEL_KEYS, what)
            f = self.operator(entry, what)
            kernel = self.get(entry, "kernel", str, what, required=True)
            if not _IDENTIFIER.match(kernel):
                raise YamlError(
                    self.key_loc(entry, "kernel"),
                    f"kernel '{kernel}' is not a C++ function name; give the bare name of a "
                    "function in cpp_namespace",
                )
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
                    loc=self.loc(entry[LINE]),
                )
            )
        return tuple(out)

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
            return FallbackPolicy(enabled=True, ops=(), blocklist=(), cpu_tensor_args=())
        section = self.mapping(top["fallback"], self.key_loc(top, "fallback").line, "'fallback'")
        self.check_keys(section, FALLBACK_KEYS, "fallback")
        return FallbackPolicy(
            enabled=self.get(section, "global", bool, "fallback", default=True),
            ops=self.op_refs(section, "ops", OP_REF_KEYS, reason=False),
            blocklist=self.op_refs(section, "blocklist", BLOCKED_KEYS, reason=True),
            cpu_tensor_args=self.op_refs(section, "cpu_tensor_args", OP_REF_KEYS, reason=False),
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
        cfg = BackendConfig(
            source=self.path,
            cpp_namespace=namespace,
            kernels=self.kernels(top),
            fallback=self.fallback(top),
        )
        self.check_unique(cfg)
        return cfg

    def check_unique(self, cfg: BackendConfig) -> None:
        """An operator is bound one way only."""
        seen: dict[str, tuple[str, Location]] = {}
        groups: list[tuple[str, list[tuple[Any, Location]]]] = [
            ("kernels", [(k.name, k.loc) for k in cfg.kernels]),
            ("fallback.ops", [(r.name, r.loc) for r in cfg.fallback.ops]),
            ("fallback.blocklist", [(r.name, r.loc) for r in cfg.fallback.blocklist]),
        ]
        for section, entries in groups:
            for name, loc in entries:
                key = str(name)
                if key in seen:
                    first_section, first_loc = seen[key]
                    raise YamlError(
                        loc,
                        f"'{key}' is already bound in {first_section} at line {first_loc.line}; "
                        "an operator has one binding: remove one of the entries",
                    )
                seen[key] = (section, loc)
        cpu_seen: dict[str, Location] = {}
        for r in cfg.fallback.cpu_tensor_args:
            key = str(r.name)
            if key in cpu_seen:
                raise YamlError(
                    r.loc, f"'{key}' is listed twice in fallback.cpu_tensor_args (also line {cpu_seen[key].line})"
                )
            cpu_seen[key] = r.loc


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if type(value) is bool:
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    return f"the string '{value}'"


def _kind_name(kind: type) -> str:
    return {bool: "true or false", str: "a string", list: "a list", dict: "a mapping"}.get(
        kind, kind.__name__
    )


def load_text(text: str, path: str) -> BackendConfig:
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
    return _Reader(path).config(data)


def load(path: str) -> BackendConfig:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise YamlError(Location(path, 0), f"cannot read the file: {e.strerror}") from None
    return load_text(text, path)
