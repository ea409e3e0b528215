"""``torch.compile(model, backend="openreg")``: Inductor, plus a report of what each graph leaves to eager kernels.

A vendor backend registers a dynamo backend of its own next to Inductor: dynamo
hands it each captured FX graph with example inputs and runs whatever callable it
returns. torch finds out-of-tree backends through the ``torch_dynamo_backends``
entry point group (``torch/_dynamo/backends/registry.py``); openreg's is declared in
pyproject.toml, so ``torch._dynamo.list_backends()`` lists "openreg" without
importing openreg, and ``backend="openreg"`` loads this module on first use.

What it adds to Inductor (which already compiles openreg graphs: docs/integration/compiler.md)
is what a backend author wants to know about a compiled model: which operators
still run outside the generated kernels, and which of those run on openreg's CPU
fallback. Each graph Inductor compiles (forward, backward, or inference) gets a
``GraphReport`` read from the generated wrapper, the code that will really run:
its C++ kernels and the aten operators it calls (extern kernels such as
``extern_kernels.mm`` and operators Inductor does not lower), each classified by
``torch_openreg.info`` (native openreg kernel, composite, CPU fallback). With
``options={"fallback": "error"}`` a graph that would call the CPU fallback fails
to compile, naming the operators, before any of it runs; ``"warn"`` warns;
the default follows ``torch.openreg.get_fallback_mode()``.

Every other option is an Inductor option (``torch.compile(..., options=...)`` as
for ``backend="inductor"``), and ``mode`` is Inductor's.
"""

from __future__ import annotations

import itertools
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

__all__ = ["GraphReport", "graph_reports", "openreg", "reset_graph_reports"]

FALLBACK_MODES = ("silent", "warn", "error")

# Calls in the wrapper's call(): openreg's C++ kernel launches, Inductor's extern
# kernels (extern_kernels.mm is aten::mm) and operators called through torch.ops.
_KERNEL_CALL = re.compile(r"^\s*(\w+)\(\*openreg_kernel_arguments\(", re.MULTILINE)
_EXTERN_CALL = re.compile(r"\bextern_kernels\.(\w+)\(")
_OPS_CALL = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)\.(\w+)\(")


@dataclass(frozen=True)
class GraphReport:
    """What one compiled graph runs: generated kernels and the operators called eagerly."""

    graph: str  # "forward 0", "backward 0", "inference 1": the kind and dynamo's graph number
    kernels: tuple[str, ...]  # generated C++ kernels, in call order
    operators: dict[str, str] = field(default_factory=dict)  # "aten::mm" -> category of torch_openreg.info

    @property
    def cpu_fallback(self) -> tuple[str, ...]:
        return tuple(name for name, category in self.operators.items() if category == "fallback")

    def __str__(self) -> str:
        lines = [f"{self.graph}: {len(self.kernels)} generated kernels, {len(self.operators)} eager operators"]
        lines += [f"  {name:<40} {category}" for name, category in sorted(self.operators.items())]
        return "\n".join(lines)


_reports: list[GraphReport] = []
_backend_calls = itertools.count()  # numbers the graphs dynamo hands over; backends are not given dynamo's ids
_lock = threading.Lock()


def graph_reports() -> list[GraphReport]:
    """Reports of the graphs compiled with backend="openreg", oldest first."""
    with _lock:
        return list(_reports)


def reset_graph_reports() -> None:
    """Forgets the reports and numbers the next graph 0."""
    global _backend_calls
    with _lock:
        _reports.clear()
        _backend_calls = itertools.count()


def report_from_wrapper(graph: str, source_code: str) -> GraphReport:
    """The report of one graph from its generated wrapper module (``CompiledFxGraph.source_code``)."""
    from torch_openreg import info

    call = source_code[source_code.find("def call(") :]
    names = [f"aten::{op}" for op in _EXTERN_CALL.findall(call)]
    names += [f"{ns}::{op}" if overload == "default" else f"{ns}::{op}.{overload}" for ns, op, overload in _OPS_CALL.findall(call)]
    bound = info.bindings()
    operators = {name: info.classify(name, bound).category for name in dict.fromkeys(names)}
    return GraphReport(graph, tuple(_KERNEL_CALL.findall(call)), operators)


def _check_fallback(report: GraphReport, mode: str) -> None:
    fallback = report.cpu_fallback
    if not fallback or mode == "silent":
        return
    message = (
        f'torch.compile(backend="openreg"): {report.graph} calls {", ".join(fallback)} on openreg\'s CPU '
        "fallback (no openreg kernel, and Inductor does not lower "
        f"{'it' if len(fallback) == 1 else 'them'}). "
        'Add a route in backend_functions.yaml (docs/adding_an_op.md), or compile with options={"fallback": "silent"}.'
    )
    if mode == "error":
        raise NotImplementedError(message)
    warnings.warn(message, stacklevel=2)


def _split_options(options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    options = dict(options or {})
    mode = options.pop("fallback", None)
    if mode is None:
        mode = torch.openreg.get_fallback_mode()
    if mode not in FALLBACK_MODES:
        raise ValueError(
            f'torch.compile(backend="openreg"): options["fallback"] must be one of {", ".join(map(repr, FALLBACK_MODES))}, '
            f"got {mode!r}"
        )
    return mode, options


def openreg(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """The dynamo backend: compiles ``gm`` with Inductor and records a GraphReport per graph."""
    from torch._functorch import config as functorch_config
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    fallback_mode, config_patches = _split_options(options)
    if mode is not None:
        config_patches = {**list_mode_options(mode), **config_patches}
    dynamo_graph = next(_backend_calls)

    def inner_compile(graph: torch.fx.GraphModule, inputs: Sequence[Any], **kwargs: Any) -> Any:
        compiled = compile_fx_inner(graph, inputs, **kwargs)
        kind = "backward" if kwargs.get("is_backward") else "inference" if kwargs.get("is_inference") else "forward"
        source = getattr(compiled, "source_code", None)
        if source is not None:
            report = report_from_wrapper(f"{kind} {dynamo_graph}", source)
            with _lock:
                _reports.append(report)
            _check_fallback(report, fallback_mode)
        return compiled

    # AOTAutograd's cache would skip inner_compile, and with it the report; Inductor's
    # FX graph cache (inside compile_fx_inner) still saves the C++ compilation.
    with functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=config_patches or None)
