"""Graph capture and replay, as torch.cuda's graphs (docs/integration/graphs.md).

What a stream launches between ``capture_begin`` and ``capture_end`` is recorded
by the runtime instead of run; ``replay()`` queues it again on the current
stream. The capture's allocations come from the graph's private memory pool, so
each replay reads and writes the tensors the capture made ("static" inputs and
outputs, as on CUDA). The C++ side is openreg's ``at::GraphImplInterface``, so
``torch.accelerator.Graph`` works on openreg as well.
"""

from __future__ import annotations

import gc
from typing import Any, Callable

import torch

from torch_openreg import _C

__all__ = [
    "OpenRegGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]


def is_current_stream_capturing() -> bool:
    """Whether the current stream of the current device is being captured into a
    graph, as torch.cuda.is_current_stream_capturing."""
    from torch_openreg.openreg import is_initialized

    return is_initialized() and _C._is_current_stream_capturing()


def graph_pool_handle() -> tuple[int, int]:
    """A token naming a new memory pool, to pass as ``pool`` to several captures
    so that they share it, as torch.cuda.graph_pool_handle."""
    return _C._graph_pool_handle()


class OpenRegGraph(torch.accelerator.Graph):
    """torch.cuda.CUDAGraph's namesake: ``capture_begin(pool, capture_error_mode)``,
    ``capture_end``, ``replay``, ``reset``, ``pool``, ``enable_debug_mode`` and
    ``debug_dump`` (a Graphviz file of the recorded nodes).

    ``capture_error_mode`` says which synchronising calls invalidate the capture:
    ``"global"`` (the default, as CUDA's) a device synchronization from any
    thread, ``"thread_local"`` one from the capturing thread, ``"relaxed"`` none.
    A call that waits for the captured stream itself (``.item()``, a copy to the
    host, ``synchronize()`` of that stream) always does."""

    def __new__(cls, keep_graph: bool = False) -> OpenRegGraph:
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False) -> None:
        super().__init__(keep_graph)

    def capture_begin(self, pool: tuple[int, int] | None = None, capture_error_mode: str = "global") -> None:
        """Begins capturing the current stream (not the default stream). Prefer
        ``torch.openreg.graph``, which also picks a side stream and warms the
        allocator."""
        self.graph_pool = pool
        self.capture_error_mode = capture_error_mode
        super().capture_begin()


class graph:
    """Captures the work of its block into ``openreg_graph``, as torch.cuda.graph:
    synchronizes the device and empties the allocator's cache first, and captures
    on ``stream`` (default: a side stream shared by every ``graph`` block of the
    device, so that a forward and its backward are captured on the same one).

    ``pool``: a token (``graph_pool_handle()`` or another graph's ``pool()``) whose
    memory pool this capture shares."""

    default_capture_streams: dict[int, torch.Stream] = {}

    def __init__(
        self,
        openreg_graph: OpenRegGraph,
        pool: tuple[int, int] | None = None,
        stream: torch.Stream | None = None,
        capture_error_mode: str = "global",
    ) -> None:
        from torch_openreg import openreg

        if not isinstance(openreg_graph, torch.accelerator.Graph):
            raise TypeError(f"torch.openreg.graph takes a torch.openreg.OpenRegGraph, not {type(openreg_graph).__name__}")
        device = openreg.current_device()
        if stream is None:
            stream = self.default_capture_streams.get(device)
            if stream is None:
                stream = self.default_capture_streams[device] = openreg.Stream()
        self.openreg_graph = openreg_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_ctx = openreg.stream(stream)

    def __enter__(self) -> None:
        from torch_openreg import openreg

        openreg.synchronize()
        if torch.compiler.config.force_cudagraph_gc:
            gc.collect()
        openreg.empty_cache()
        self._stream_ctx.__enter__()
        try:
            self.openreg_graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.openreg_graph.capture_end()
        finally:
            self._stream_ctx.__exit__(*exc)


def make_graphed_callables(
    callables: Any,
    sample_args: Any,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: tuple[int, int] | None = None,
) -> Any:
    """Graphed versions of ``callables`` (functions or modules), as
    torch.cuda.make_graphed_callables: each one's forward and backward are
    captured into two graphs, which a call replays, copying new inputs into the
    captured ones. ``sample_args`` gives each callable a tuple of tensors. A
    module keeps its original forward for the other training mode. Modules must
    have no hooks when passed, and only parameters may require grad."""
    from torch_openreg import openreg

    if torch.is_autocast_enabled("openreg") and torch.is_autocast_cache_enabled():
        raise RuntimeError(
            "make_graphed_callables under torch.autocast with its weight cache on: the casts cached during the "
            "capture would be freed when the autocast region ends while the graphs still use them. Pass "
            "cache_enabled=False to torch.autocast.")
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError(f"make_graphed_callables: {len(callables)} callables but {len(sample_args)} sample_args")

    flat_args = []
    for c, args in zip(callables, sample_args):
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise ValueError(
                    "Modules passed to make_graphed_callables must have no hooks yet (hooks registered after "
                    "are allowed).")
            if any(b.requires_grad for b in c.buffers()):
                raise ValueError("In modules passed to make_graphed_callables only parameters may require grad.")
        leaves = tuple(torch.utils._pytree.arg_tree_leaves(*args))
        if not all(isinstance(a, torch.Tensor) for a in leaves):
            raise TypeError("make_graphed_callables: sample_args may contain only tensors.")
        flat_args.append(leaves)
    params = [tuple(c.parameters()) if isinstance(c, torch.nn.Module) else () for c in callables]
    surfaces = [args + p for args, p in zip(flat_args, params)]
    mempool = graph_pool_handle() if pool is None else pool

    def grads_of(outputs: tuple[torch.Tensor, ...], surface: tuple[torch.Tensor, ...], grad_outputs: Any) -> Any:
        needed = tuple(o for o in outputs if o.requires_grad)
        if not needed:
            return None
        return torch.autograd.grad(
            outputs=needed, inputs=tuple(i for i in surface if i.requires_grad), grad_outputs=grad_outputs,
            only_inputs=True, allow_unused=allow_unused_input)

    # Warm-up on a side stream, so that what a first call does once (lazy
    # initialisation) is not captured. Nothing of it may stay alive: autograd
    # nodes made on the warm-up's stream (the parameters' AccumulateGrad)
    # would make the captured backward synchronise with that stream.
    openreg.synchronize()
    with openreg.stream(openreg.Stream()):
        for c, args, surface in zip(callables, sample_args, surfaces):
            for _ in range(num_warmup_iters):
                outputs = tuple(torch.utils._pytree.tree_leaves(c(*args)))
                grads_of(outputs, surface, tuple(torch.empty_like(o) for o in outputs if o.requires_grad))
                del outputs
    openreg.synchronize()

    # All graphs share the pool, so they are captured in the order they will
    # run: every forward, then the backwards in reverse.
    fwd_graphs = [OpenRegGraph() for _ in callables]
    bwd_graphs = [OpenRegGraph() for _ in callables]
    static_outputs, specs = [], []
    for c, args, g in zip(callables, sample_args, fwd_graphs):
        with graph(g, pool=mempool):
            outputs = c(*args)
        flat, spec = torch.utils._pytree.tree_flatten(outputs)
        static_outputs.append(tuple(flat))
        specs.append(spec)
    static_grad_outputs: list[Any] = [None] * len(callables)
    static_grad_inputs: list[Any] = [None] * len(callables)
    for i in reversed(range(len(callables))):
        grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in static_outputs[i])
        grads = None
        if any(g is not None for g in grad_outputs):
            with graph(bwd_graphs[i], pool=mempool):
                grads = grads_of(static_outputs[i], surfaces[i], tuple(g for g in grad_outputs if g is not None))
        else:
            bwd_graphs[i] = None  # nothing to differentiate: backward is never called
        # One slot per input of the surface: None where it needs no grad.
        it = iter(grads or ())
        static_grad_inputs[i] = tuple(next(it) if a.requires_grad and grads is not None else None for a in surfaces[i])
        static_grad_outputs[i] = grad_outputs

    def graphed_function(i: int) -> Callable[..., Any]:
        n_user = len(flat_args[i])
        surface, outputs = surfaces[i], static_outputs[i]
        fwd, bwd = fwd_graphs[i], bwd_graphs[i]

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                for static, new in zip(surface[:n_user], inputs[:n_user]):
                    if static.data_ptr() != new.data_ptr():
                        static.copy_(new)
                fwd.replay()
                return tuple(o.detach() for o in outputs)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
                for static, grad in zip(static_grad_outputs[i], grads):
                    if static is not None and static.data_ptr() != grad.data_ptr():
                        static.copy_(grad)
                bwd.replay()
                return tuple(g.detach() if g is not None else None for g in static_grad_inputs[i])

        def run(*user_args: Any) -> Any:
            flat = tuple(torch.utils._pytree.arg_tree_leaves(*user_args))
            return torch.utils._pytree.tree_unflatten(Graphed.apply(*(flat + params[i])), specs[i])

        return run

    graphed = []
    for i, c in enumerate(callables):
        run = graphed_function(i)
        if isinstance(c, torch.nn.Module):
            def forward(*args: Any, _c: torch.nn.Module = c, _run: Callable[..., Any] = run,
                        _training: bool = c.training, _eager: Callable[..., Any] = c.forward) -> Any:
                # The graphs hold one training mode's work; the other runs eagerly.
                return _run(*args) if _c.training == _training else _eager(*args)

            c.forward = forward
            graphed.append(c)
        else:
            graphed.append(run)
    return graphed[0] if single else tuple(graphed)
