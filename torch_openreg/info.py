"""What serves each operator on openreg: the report behind
``python -m torch_openreg info [--op NAME | --fallbacks] [--json]``.

Each aten operator is classified by the PrivateUse1 entry of its computed
dispatch table (``torch._C._dispatch_dump_table``), which is what the
dispatcher will really call, and by the bindings of backend_functions.yaml
(compiled into the extension), which say how an openreg kernel serves it:

- native: a route of backend_functions.yaml serves it (``_C.Route``: kernel,
  structured, structured_impl, structured_on_cpu_aliases, cpu_kernel,
  custom_op), or a PrivateUse1 kernel registered elsewhere;
- composite: needs no openreg kernel, a CompositeImplicitAutograd or
  CompositeExplicitAutograd kernel runs it through other operators;
- fallback: runs on the CPU fallback (route fallback);
- blocked: in the yaml blocklist, raises NotImplementedError (route blocked);
- unsupported: nothing can run it on openreg (no CPU kernel for the fallback).

On a nested tensor of the strided layout an operator dispatches to another key,
NestedTensorPrivateUse1; ``nested`` says what serves it there (NESTED_ROUTES):

- nested_fallback (the route): the nested CPU fallback, the operator's NestedTensorCPU
  kernel on the device memory;
- composite: a CompositeImplicitAutograd kernel runs it through other operators;
- unsupported: no NestedTensorCPU kernel (raises NotImplementedError, as CPU does);
- refused: the yaml turns the nested fallback off (fallback.nested: false).

On a sparse COO tensor it dispatches to SparsePrivateUse1; ``sparse`` says what
serves it there (SPARSE_ROUTES, docs/integration/operators.md):

- sparse_fallback (the route): the sparse CPU fallback, the operator's SparseCPU
  kernel on the device memory;
- composite: a CompositeImplicitAutograd or CompositeExplicitAutograd kernel runs it
  through other operators;
- unsupported: no SparseCPU kernel (raises NotImplementedError, as CPU does);
- refused: the yaml turns the sparse fallback off (fallback.sparse: false).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch

from torch_openreg import _C

CATEGORIES = ("native", "composite", "fallback", "blocked", "unsupported")
NESTED_ROUTES = ("nested_fallback", "composite", "unsupported", "refused")
SPARSE_ROUTES = ("sparse_fallback", "composite", "unsupported", "refused")

# "PrivateUse1: registered at FILE:LINE [kernel]" in a computed dispatch table.
_ENTRY = re.compile(r"^PrivateUse1: (?P<text>.*?)(?: \[(?P<tag>[^\]]+)\])?$", re.MULTILINE)
_NESTED_ENTRY = re.compile(r"^NestedTensorPrivateUse1: (?P<text>.*?)(?: \[(?P<tag>[^\]]+)\])?$", re.MULTILINE)
_SPARSE_ENTRY = re.compile(r"^SparsePrivateUse1: (?P<text>.*?)(?: \[(?P<tag>[^\]]+)\])?$", re.MULTILINE)
_COMPOSITE_TAGS = {
    "math kernel": "CompositeImplicitAutograd",
    "default backend kernel": "CompositeExplicitAutograd",
}


@dataclass(frozen=True)
class OperatorReport:
    name: str  # "aten::add.Tensor"
    category: str  # one of CATEGORIES
    served_by: str  # how openreg runs it, in words
    dispatch_entry: str  # the PrivateUse1 line of the dispatch table, "" if none
    nested: str = ""  # on a nested tensor of the strided layout: one of NESTED_ROUTES
    sparse: str = ""  # on a sparse COO tensor: one of SPARSE_ROUTES


def nested_route(name: str, table: str | None = None) -> str:
    """What serves ``name`` on a nested openreg tensor of the strided layout,
    from the NestedTensorPrivateUse1 entry of its computed dispatch table."""
    table = torch._C._dispatch_dump_table(name) if table is None else table
    match = _NESTED_ENTRY.search(table)
    tag = (match.group("tag") or "") if match else ""
    if tag == "math kernel":
        return "composite"
    if match is None:
        return "unsupported"  # nothing registered (fallback.global: false)
    if not _C._nested_fallback():
        return "refused"
    # The nested fallback (the key's backend fallback, or registered by name),
    # which raises for an operator without a NestedTensorCPU kernel.
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, "NestedTensorCPU"):
        return "nested_fallback"
    return "unsupported"


def sparse_route(name: str, table: str | None = None) -> str:
    """What serves ``name`` on a sparse COO openreg tensor, from the
    SparsePrivateUse1 entry of its computed dispatch table."""
    table = torch._C._dispatch_dump_table(name) if table is None else table
    match = _SPARSE_ENTRY.search(table)
    tag = (match.group("tag") or "") if match else ""
    if tag in _COMPOSITE_TAGS:
        return "composite"
    if match is None:
        return "unsupported"  # nothing registered (fallback.global: false)
    if not _C._sparse_fallback():
        return "refused"
    # The sparse fallback, which raises for an operator without a SparseCPU kernel.
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, "SparseCPU"):
        return "sparse_fallback"
    return "unsupported"


Route = _C.Route


def bindings() -> dict[str, tuple[Route, str]]:
    """{operator or stub: (route, serving function or blocked reason)} from the yaml."""
    return {name: (route, detail) for name, route, detail in _C._bindings()}


def classify(name: str, bound: dict[str, tuple[Route, str]] | None = None) -> OperatorReport:
    """How openreg serves the operator ``name`` (e.g. "aten::add.Tensor")."""
    return _classify(name, bound, torch._C._dispatch_dump_table(name))


def _classify(name: str, bound: dict[str, tuple[Route, str]] | None, table: str) -> OperatorReport:
    bound = bindings() if bound is None else bound
    nested = nested_route(name, table)
    sparse = sparse_route(name, table)
    match = _ENTRY.search(table)
    entry = match.group(0).removeprefix("PrivateUse1: ") if match else ""
    tag = (match.group("tag") or "") if match else ""
    route, detail = bound.get(name, (None, ""))
    if route == Route.blocked:
        return OperatorReport(name, "blocked", f"blocked: {detail}", entry, nested, sparse)
    if route == Route.fallback:
        return OperatorReport(name, "fallback", "fallback (fallback.ops in the yaml)", entry, nested, sparse)
    if route is not None:
        return OperatorReport(name, "native", f"{route.name} {detail}", entry, nested, sparse)
    if tag == "kernel":
        return OperatorReport(name, "native", "a PrivateUse1 kernel registered outside backend_functions.yaml", entry, nested, sparse)
    if tag in _COMPOSITE_TAGS:
        return OperatorReport(
            name, "composite", f"{_COMPOSITE_TAGS[tag]} kernel: runs through other operators", entry, nested, sparse
        )
    if tag == "backend fallback":
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            return OperatorReport(name, "fallback", "fallback", entry, nested, sparse)
        return OperatorReport(name, "unsupported", "fallback, but the operator has no CPU kernel", entry, nested, sparse)
    return OperatorReport(name, "unsupported", "no PrivateUse1 kernel and no fallback", entry, nested, sparse)


def operators(namespace: str = "aten") -> list[str]:
    prefix = namespace + "::"
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix))


def _memory(index: int) -> dict[str, int]:
    free, total = torch.openreg.mem_get_info(index)
    return {"total": total, "free": free}


def report() -> dict[str, Any]:
    """Versions, devices, modes and the operator counts, as `info --json` prints them."""
    bound = bindings()
    aten = [classify(n, bound) for n in operators("aten")]
    counts = {c: sum(1 for r in aten if r.category == c) for c in CATEGORIES}
    routes: dict[str, int] = {}
    for r in aten:
        if r.category == "native":
            route = bound[r.name][0].name if r.name in bound else "registered outside the yaml"
            routes[route] = routes.get(route, 0) + 1
    return {
        "torch_openreg": _version(),
        "torch": torch.__version__,
        "devices": [
            {"index": i, "name": torch.openreg.get_device_name(i), "memory": _memory(i)}
            for i in range(torch.openreg.device_count())
        ],
        "fallback_mode": torch.openreg.get_fallback_mode(),
        "global_fallback": _C._global_fallback(),
        "nested_fallback": _C._nested_fallback(),
        "sparse_fallback": _C._sparse_fallback(),
        "dispatch_trace": torch.openreg.is_dispatch_trace_enabled(),
        "aten_operators": len(aten),
        "counts": counts,
        "nested_counts": {route: sum(1 for r in aten if r.nested == route) for route in NESTED_ROUTES},
        "sparse_counts": {route: sum(1 for r in aten if r.sparse == route) for route in SPARSE_ROUTES},
        "native_by_route": dict(sorted(routes.items())),
        "custom_operators": operators("openreg"),
        "stubs": {
            route.name: sorted(n for n, (r, _) in bound.items() if r == route)
            for route in (Route.stub_kernel, Route.stub_cpu_kernel)
        },
    }


def operator_report(name: str) -> list[dict[str, Any]]:
    """Each overload matching ``name`` ("add", "add.Tensor", "aten::add.out",
    "openreg::add_relu"): its classification and full dispatch table."""
    qualified = name if "::" in name else f"aten::{name}"
    known = torch._C._dispatch_get_all_op_names()
    if "." in qualified.split("::", 1)[1]:
        names = [qualified] if qualified in known else []
    else:  # every overload
        names = sorted(n for n in known if n.split(".")[0] == qualified)
    if not names:
        raise LookupError(
            f"no operator named {name!r}: give it as in 'add', 'add.Tensor' or 'aten::add.out'"
        )
    bound = bindings()
    return [
        {**asdict(classify(n, bound)), "dispatch_table": torch._C._dispatch_dump_table(n)}
        for n in names
    ]


def fallback_operators() -> list[str]:
    """The aten operators the CPU fallback serves on dense openreg tensors, by name:
    the ones to give a kernel first (docs/adding_an_op.md)."""
    bound = bindings()
    return [n for n in operators("aten") if classify(n, bound).category == "fallback"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch_openreg")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _print_report(r: dict[str, Any]) -> None:
    print(f"torch_openreg {r['torch_openreg']} (torch {r['torch']})")
    print(f"devices: {len(r['devices'])}")
    for d in r["devices"]:
        mem = d["memory"]
        print(f"  openreg:{d['index']}  {d['name']}  memory {_gib(mem['total'])}, {_gib(mem['free'])} free")
    print(f"fallback mode: {r['fallback_mode']} (global fallback {'on' if r['global_fallback'] else 'off'})")
    print(f"dispatch trace: {'on' if r['dispatch_trace'] else 'off'}")
    print(f"aten operators: {r['aten_operators']}")
    for category in CATEGORIES:
        print(f"  {category:<12}{r['counts'][category]:>6}")
    for route, n in r["native_by_route"].items():
        print(f"    {route:<24}{n:>6}")
    nested = "nested CPU fallback" if r["nested_fallback"] else "refused (fallback.nested: false)"
    print(f"on nested tensors of the strided layout: {nested}")
    for route in NESTED_ROUTES:
        print(f"  {route:<16}{r['nested_counts'][route]:>6}")
    sparse = "sparse CPU fallback" if r["sparse_fallback"] else "refused (fallback.sparse: false)"
    print(f"on sparse COO tensors: {sparse}")
    for route in SPARSE_ROUTES:
        print(f"  {route:<16}{r['sparse_counts'][route]:>6}")
    print(f"custom operators: {len(r['custom_operators'])} ({', '.join(r['custom_operators'])})")
    print(f"stubs: {', '.join(f'{len(names)} {route}' for route, names in r['stubs'].items())}")


def _print_operator(entries: list[dict[str, Any]]) -> None:
    for i, e in enumerate(entries):
        if i:
            print()
        print(f"{e['name']}: {e['category']}")
        print(f"  served by: {e['served_by']}")
        print(f"  PrivateUse1 entry: {e['dispatch_entry'] or '(none)'}")
        print(f"  on a nested tensor (strided layout): {e['nested']}")
        print(f"  on a sparse COO tensor: {e['sparse']}")
        print("  dispatch table:")
        for line in e["dispatch_table"].splitlines():
            print(f"    {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_openreg", description="What serves each operator on openreg, and the devices."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="version, devices, memory and operator coverage")
    which = info.add_mutually_exclusive_group()
    which.add_argument("--op", metavar="NAME", help="show how openreg serves this operator, and its dispatch table")
    which.add_argument("--fallbacks", action="store_true", help="list the operators the CPU fallback serves")
    info.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        _run(parser, args)
    except BrokenPipeError:  # `... info | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.fallbacks:
        names = fallback_operators()
        print(json.dumps(names, indent=2) if args.json else "\n".join(names))
        return
    if args.op is not None:
        try:
            data: Any = operator_report(args.op)
        except LookupError as e:
            parser.exit(2, f"python -m torch_openreg info: {e.args[0]}\n")
        printer = _print_operator
    else:
        data = report()
        printer = _print_report
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        printer(data)
