"""Inductor's lowering choices for the CPU, made for openreg graphs too.

Inductor lowers an openreg graph into kernels of its C++ backend, the CPU's
(``OpenRegScheduling`` is ``CppScheduling``). Some decisions of torch 2.13 test
``device.type == "cpu"`` where what they depend on is that backend, so an openreg
graph got the choices made for Triton on GPUs: other arithmetic than compiled CPU
code, and wrong indices from arg reductions. ``register`` extends the CPU's
branch of these to openreg (torch/_inductor/):

- ``lowering.use_two_step_variance``: var_mean (LayerNorm, BatchNorm, var, std)
  takes two passes up to ``config.cpp.use_two_step_variance_threshold`` elements,
  not Welford above ``config.unroll_reductions_threshold``.
- ``lowering.div_prim``: a division by a constant stays a division, not a
  multiplication by the reciprocal (pytorch#157959).
- ``lowering._make_reduction_inner``: argmax/argmin over several dimensions of a
  non-contiguous input compute the row-major index; without it the C++ kernel
  returns the index of its own loop order.
- ``ir.is_cpu``: the realisation heuristics (store a reused exp/log/tanh/sigmoid
  rather than recompute it in each user; ``config.realize_cpu_*`` thresholds).
  A recomputed bfloat16 intermediate is not rounded to bfloat16.

docs/integration/compiler.md lists the CPU decisions left alone and why. Each replacement
calls torch's own function for every other device.
"""

from __future__ import annotations

from typing import Any, Callable

import sympy
import torch
from torch._inductor import config, ir, lowering
from torch._inductor.utils import sympy_product
from torch._inductor.virtualized import ops

prims = torch.ops.prims

# The reduction types whose result is an index (lowering.py, _make_reduction_inner).
_ARG_REDUCTIONS = frozenset(
    {"argmax", "argmin", "argmax_value", "argmin_value", "argmax_with_value", "argmin_with_value"}
)


def _is_openreg(x: Any) -> bool:
    return isinstance(x, ir.IRNode) and ir.get_device_type(x) == "openreg"


def _two_step_variance(torch_fn: Callable[..., bool]) -> Callable[..., bool]:
    def use_two_step_variance(x: Any, axis: Any, keepdim: bool, input_dtype: torch.dtype) -> bool:
        if not _is_openreg(x):
            return torch_fn(x, axis, keepdim, input_dtype)
        # The CPU branch: two passes (sum, then sum of squared deviations) for a
        # static reduction of at most the C++ threshold's elements, unless it
        # reduces everything to one value.
        kwargs = lowering._make_reduction_inner(
            x,
            axis=lowering._validate_reduction_axis(x, axis),
            keepdims=keepdim,
            dtype=None,
            override_return_dtype=None,
        )
        numel = sympy_product(kwargs["reduction_ranges"])
        return (
            isinstance(numel, sympy.Integer)
            and int(numel) <= config.cpp.use_two_step_variance_threshold
            and sympy_product(kwargs["ranges"]) != 1
        )

    return use_two_step_variance


def _division_kept(torch_lowering: Callable[..., Any]) -> Callable[..., Any]:
    # _register_lowering wraps the function (broadcasting, type promotion) with
    # functools.wraps, so __wrapped__ is torch's div_prim itself.
    torch_fn = torch_lowering.__wrapped__

    def div_prim(a: Any, b: Any) -> Any:
        integral = all(lowering.is_boolean_type(t) or lowering.is_integer_type(t) for t in (a, b))
        if integral or not _is_openreg(a):
            return torch_fn(a, b)
        # The CPU branch: a true division, even by a constant.
        return lowering.make_pointwise(lambda x, y: ops.truediv(x, y))(a, b)

    return lowering.register_lowering(prims.div, broadcast=True)(div_prim)


def _logical_arg_indices(torch_fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def _make_reduction_inner(
        x: Any, *, axis: Any, keepdims: bool, dtype: Any, override_return_dtype: Any, reduction_type: Any = None
    ) -> dict[str, Any]:
        kwargs = torch_fn(
            x,
            axis=axis,
            keepdims=keepdims,
            dtype=dtype,
            override_return_dtype=override_return_dtype,
            reduction_type=reduction_type,
        )
        reduced_sizes = kwargs["reduction_ranges"]
        if (
            reduction_type not in _ARG_REDUCTIONS
            or dtype is not None  # arg reductions take none
            or len(reduced_sizes) < 2
            or config.cpu_backend != "cpp"
            or not _is_openreg(x)
            or not _needs_logical_index(x)
        ):
            return kwargs
        # The CPU branch: the loader returns each value with its row-major index
        # in the reduced dimensions, which the C++ kernel keeps as the result.
        value_at = kwargs["inner_fn"]

        def inner_fn(index: Any, reduction_index: Any) -> Any:
            rindex = [sympy.expand(i) for i in reduction_index]
            linear = rindex[0]
            for i, size in zip(rindex[1:], reduced_sizes[1:]):
                linear = linear * size + i
            return value_at(index, reduction_index), ops.index_expr(linear, torch.int64)

        kwargs["inner_fn"] = inner_fn
        return kwargs

    return _make_reduction_inner


def _needs_logical_index(x: Any) -> bool:
    """_make_reduction_inner's test: is the input not laid out row-major?"""
    if isinstance(x.data, ir.PermuteView):
        return True
    if isinstance(x.data, ir.ReinterpretView) or (
        isinstance(x.data, ir.StorageBox) and isinstance(x.data.data, ir.Buffer)
    ):
        layout = x.get_layout()
        return layout.is_transposed() or not layout.is_contiguous()
    return False


def _cpp_nodes_count_as_cpu(torch_fn: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def is_cpu(x: Any) -> bool:
        return torch_fn(x) or ir.get_device_type(x) == "openreg"

    return is_cpu


def register() -> None:
    """Extends the CPU's lowering choices above to openreg (once)."""
    if getattr(lowering, "_openreg_cpu_choices", False):
        return
    # Every caller looks these names up in the module when it runs.
    lowering.use_two_step_variance = _two_step_variance(lowering.use_two_step_variance)
    lowering.div_prim = _division_kept(lowering.div_prim)
    lowering._make_reduction_inner = _logical_arg_indices(lowering._make_reduction_inner)
    # ir.py's realisation heuristics are its only callers (torch 2.13).
    ir.is_cpu = _cpp_nodes_count_as_cpu(ir.is_cpu)
    lowering._openreg_cpu_choices = True
