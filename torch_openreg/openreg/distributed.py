"""torch.distributed on openreg tensors: a c10d process group over torch's own gloo.

``import torch_openreg`` registers the backend ``"openreg_gloo"`` for the device type
``openreg`` (``Backend.register_backend``), so that

- ``dist.init_process_group()`` (no backend; torch picks the accelerator's default,
  ``Backend.default_device_backend_map["openreg"]``),
- ``dist.init_process_group("openreg_gloo")``,
- ``dist.init_process_group("cpu:gloo,openreg:openreg_gloo")``, and
- ``dist.init_process_group(device_id=torch.device("openreg", rank))``

all give a group whose collectives take openreg tensors (and CPU tensors).

How: the group owns a ``ProcessGroupGloo`` built on the store, rank and size c10d hands
the backend creator, and forwards every collective to it with each openreg tensor
replaced by its *CPU alias* (``_C._host_aliases``: a CPU tensor over the same bytes, after
joining the current stream of its device). Gloo therefore reads and writes device memory
in place, with its own transport (TCP on loopback or the interface gloo picks): no
staging copies and no home-made transport. docs/integration/distributed.md gives the reasoning.
"""

from __future__ import annotations

import atexit
import datetime
import time
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from torch_openreg import _C

__all__ = ["BACKEND_NAME", "ProcessGroupOpenRegGloo"]

# Named like the engine it is (gloo) and the device it adapts it to: a name of its own
# ("orccl") would suggest a collective library of openreg's, which there is not.
BACKEND_NAME = "openreg_gloo"


def _flatten(items: Any) -> list[torch.Tensor]:
    """The tensors in a tensor, or a list (of lists) of tensors, in order."""
    if isinstance(items, torch.Tensor):
        return [items]
    return [t for item in items for t in _flatten(item)]


def _replaced(items: Any, replacement: dict[int, torch.Tensor]) -> Any:
    """``items`` with the same nesting, each tensor replaced by what gloo gets instead
    (its CPU alias, or a contiguous copy's)."""
    if isinstance(items, torch.Tensor):
        return replacement.get(id(items), items)
    return [_replaced(item, replacement) for item in items]


def _check_one_device(op: str, tensors: list[torch.Tensor]) -> None:
    """One collective call works on one device, as ProcessGroupNCCL requires of a rank's
    tensors. Gloo would take a CPU tensor next to a CPU alias without a word and mix
    host and device memory in one call; refuse that with the devices named instead."""
    devices = {t.device for t in tensors}
    if len(devices) > 1 and any(d.type == "openreg" for d in devices):
        names = ", ".join(sorted(str(d) for d in devices))
        raise ValueError(
            f"{BACKEND_NAME} {op}: all tensors of one call must be on one device, got tensors on "
            f"{names}. Move them to the same device first (e.g. tensor.to('openreg:0'))."
        )


class ProcessGroupOpenRegGloo(dist.ProcessGroup):
    """A process group whose collectives take openreg (and CPU) tensors, run by gloo.

    It is a Python ``ProcessGroup`` rather than a c10d ``Backend`` because torch's Python
    bindings only let a Python class override collectives of a ``ProcessGroup`` (the
    ``PyProcessGroup`` trampoline, torch/csrc/distributed/c10d/PyProcessGroup.hpp): C++
    callers such as DDP's reducer and ``_broadcast_coalesced`` reach these methods
    through it; C++ that calls a method the trampoline does not forward (``reduce``,
    ``_allgather_base``, ...) reaches them through the group's openreg backend, a C++
    ``Backend`` that calls them (see ``__init__``). c10d then uses this object as the whole group
    (``_new_process_group_helper``: "If the type is a subclass of ProcessGroup then
    return this process group immediately"), so it serves CPU tensors too, through the
    same gloo, without aliases.

    Completion: a collective returns as soon as gloo has queued it, like gloo on CPU
    tensors. Its ``Work.wait()`` returns once gloo has written the results into device
    memory; openreg kernels launched after that see them (they run in the launching
    thread, and ``_host_aliases`` joined the current stream before gloo read the inputs).
    ``async_op=False`` and DDP's reducer wait for every collective. ``work.get_future()``
    gives the openreg tensors (not their CPU aliases), which DDP copies into gradients.
    A call with a non-contiguous tensor completes before returning (see ``_run``).
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: datetime.timedelta = dist.constants.default_pg_timeout,
        *,
        options: Any = None,
        group_name: str | None = None,
        global_ranks_in_group: list[int] | None = None,
    ) -> None:
        # (rank, size): in torch 2.13 only this constructor builds the trampoline that
        # lets C++ reach the methods below; (store, rank, size) refuses a subclass.
        super().__init__(rank, size)
        # The store is c10d's per-device prefix store ("<group>/openreg/"), which no
        # other backend of the group uses, so gloo's rendezvous keys cannot collide.
        if options is None:
            self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        elif isinstance(options, dist.ProcessGroupGloo._Options):
            options._timeout = timeout
            self._gloo = dist.ProcessGroupGloo(store, rank, size, options)
        else:
            raise TypeError(
                f"{BACKEND_NAME} takes ProcessGroupGloo options (pg_options="
                f"torch.distributed.ProcessGroupGloo._Options()), got {type(options).__name__}"
            )
        # What distributed_c10d sets on a ProcessGroupGloo it creates itself.
        if global_ranks_in_group:
            self._gloo.options.global_ranks_in_group = global_ranks_in_group
        if group_name:
            self._gloo.options.group_name = group_name
        self._gloo._set_sequence_number_for_group()
        # What runs the collectives: gloo, or with TORCH_DISTRIBUTED_DEBUG=DETAIL gloo
        # behind torch's ProcessGroupWrapper, as c10d wraps its own gloo and NCCL groups
        # (_new_process_group_helper). Before each collective it compares the ranks'
        # (op, shapes, dtypes) over a second gloo and raises "Detected mismatch between
        # collectives on ranks" naming both; gloo alone, given different sizes, aborts
        # the process from its thread ("Received data size doesn't match expected
        # size") or, on the rank expecting more, returns a partly written result.
        self._backend = self._gloo
        if dist.get_debug_level() == dist.DebugLevel.DETAIL:
            self._backend = dist.distributed_c10d._create_process_group_wrapper(
                self._gloo, BACKEND_NAME, store, rank, size, timeout
            )
        # The backends C++ code gets from ProcessGroup::getBackend, which c10d's
        # dispatcher ops (torch/csrc/distributed/c10d/Ops.cpp) ask for whenever C++
        # calls a collective the trampoline does not forward to the methods below
        # (reduce, gather, scatter, alltoall, _allgather_base, ...). CPU tensors: gloo
        # itself, which also holds the group's name and description (c10d keeps them
        # in the backends, ProcessGroup::setGroupName). openreg tensors: a C++ backend
        # whose collectives call the methods below (csrc/python/
        # OpenRegProcessGroupBackend.cpp), never gloo, which must not see a device
        # address. CUSTOM, not GLOO: c10d keeps one backend per type and would hand
        # openreg tensors to the CPU one.
        self._set_default_backend(c10d.ProcessGroup.BackendType.GLOO)
        self._register_backend(torch.device("cpu"), c10d.ProcessGroup.BackendType.GLOO, self._gloo)
        self._register_backend(
            torch.device("openreg"), c10d.ProcessGroup.BackendType.CUSTOM,
            _C._process_group_backend(self, rank, size, BACKEND_NAME),
        )
        # A plain group over the same gloo, for the coalesced collectives that gloo's
        # Python binding does not expose (all_gather_single_coalesced below); calling
        # them on this group would come back to the Python methods through the
        # trampoline. Its tensors are CPU tensors and aliases only.
        self._gloo_group = c10d.ProcessGroup(rank, size)
        self._gloo_group._set_default_backend(c10d.ProcessGroup.BackendType.GLOO)
        self._gloo_group._register_backend(torch.device("cpu"), c10d.ProcessGroup.BackendType.GLOO, self._backend)
        # The tensors this group made for gloo (CPU aliases, contiguous copies), one
        # list per call, kept until gloo has let go of them: see _retire.
        self._in_flight: list[list[torch.Tensor]] = []
        _GROUPS.add(self)

    # --- identity -----------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802  (the C++ virtual's name)
        return BACKEND_NAME

    def splitGroup(self, *args: Any) -> None:  # noqa: N802  (the C++ virtual's name)
        """``ProcessGroup::splitGroup``, which the trampoline forwards here (from C++, and
        from ``group.split_group(...)``): torch's would dereference the store this group
        was not built with (the trampoline's constructor takes none) and crash."""
        raise RuntimeError(
            f"{BACKEND_NAME} cannot split a group: make the sub-group with torch.distributed.new_group(ranks), "
            "as init_device_mesh does."
        )

    def shutdown(self) -> None:
        self._drain()
        self._gloo.shutdown()

    # --- tensors gloo holds ---------------------------------------------------------

    def _retire(self) -> None:
        """Forgets the tensors of calls gloo is done with.

        Gloo's worker thread releases a collective's tensors (and our future callback)
        after completing it. Were it the last owner of a CPU alias, it would free the
        alias's Python object, taking the GIL, and a worker thread that takes the GIL
        while the interpreter finalises aborts the process ("terminate called without
        an active exception"). So this group holds every alias until gloo has let go
        of it (``_use_count() == 1``: only our reference left); then dropping it here
        frees it in this thread.
        """
        self._in_flight = [made for made in self._in_flight if any(t._use_count() > 1 for t in made)]

    def _drain(self, timeout: float = 5.0) -> None:
        """Waits (at most ``timeout`` s) until gloo has let go of every tensor this group
        gave it: at ``destroy_process_group`` and before the interpreter finalises."""
        deadline = time.monotonic() + timeout
        self._retire()
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.001)  # lets gloo's thread take the GIL it may need
            self._retire()

    def abort(self) -> None:
        self._gloo.abort()

    # --- forwarding -----------------------------------------------------------------

    def _run(
        self,
        op: str,
        call: Callable[..., dist.Work],
        args: tuple[Any, ...],
        result: Any = None,
        writes_first: bool = True,
    ) -> dist.Work:
        """Calls ``call`` (a gloo method) on ``args`` with openreg tensors host-aliased.

        Returns a ``_Work`` over gloo's, which names ``op`` in gloo's errors. ``result``
        (tensors of ``args``) becomes the value of its future; without one, its future is
        gloo's: gloo has none for that collective either (reduce_scatter, send, recv).
        ``writes_first``: gloo writes the tensors of the first argument (all but send).
        """
        tensors = [t for arg in args if _is_tensors(arg) for t in _flatten(arg)]
        _check_one_device(op, tensors)
        # Gloo takes a tensor's memory as numel() consecutive elements: on CPU tensors
        # too, broadcasting into a column or gathering into strided outputs writes the
        # wrong elements, and send refuses ("input tensor has to be contiguous"). So a
        # non-contiguous tensor goes through a contiguous copy on its device, and the
        # results are copied back once gloo is done (below).
        staged = {id(t): t.contiguous() for t in tensors if not t.is_contiguous()}
        stand_ins = [staged.get(id(t), t) for t in tensors]
        device_tensors = [t for t in stand_ins if t.device.type == "openreg"]
        if not device_tensors and not staged:
            # CPU tensors only: exactly what gloo does with them, gloo's own work.
            return _Work(op, _calling(op, call, args))
        self._retire()
        # One call for all of them: it joins each device's current stream once, so work
        # queued there (a non-blocking copy into an input) is done before gloo reads.
        aliases = dict(zip(map(id, device_tensors), _C._host_aliases(device_tensors)))
        replacement = {id(t): aliases.get(id(s), s) for t, s in zip(tensors, stand_ins)}
        self._in_flight.append(list(aliases.values()) + list(staged.values()))
        work = _calling(op, call, tuple(_replaced(arg, replacement) if _is_tensors(arg) else arg for arg in args))
        if staged:
            # Copying back needs gloo's results: this call completes before returning
            # (an error is raised here rather than by wait()). The copies are device
            # kernels on this thread's current stream, like any after wait().
            _Work(op, work).wait()
            if writes_first:
                for t in _flatten(args[0]):
                    if id(t) in staged:
                        t.copy_(staged[id(t)])
            return _Work(op, result=result)
        return _Work(op, work, result)

    # --- collectives (names and signatures of torch.distributed.ProcessGroup) ---------

    def allreduce(self, tensors, opts=None):
        opts = _options(c10d.AllreduceOptions, opts)
        return self._run("allreduce", self._backend.allreduce, (tensors, opts), result=tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = _options(c10d.AllreduceCoalescedOptions, opts)
        return self._run("allreduce_coalesced", self._backend.allreduce_coalesced, (tensors, opts), result=tensors)

    def broadcast(self, tensors, opts=None):
        opts = _options(c10d.BroadcastOptions, opts)
        return self._run("broadcast", self._backend.broadcast, (tensors, opts), result=tensors)

    def reduce(self, tensors, opts=None):
        opts = _options(c10d.ReduceOptions, opts)
        return self._run("reduce", self._backend.reduce, (tensors, opts), result=tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = _options(c10d.AllgatherOptions, opts)
        return self._run(
            "allgather", self._backend.allgather, (output_tensors, input_tensors, opts), result=output_tensors
        )

    def all_gather_single(self, output, input, opts=None):
        """``all_gather_into_tensor``."""
        opts = _options(c10d.AllgatherOptions, opts)
        return self._run("all_gather_into_tensor", self._backend._allgather_base, (output, input, opts), result=[output])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        opts = _options(c10d.AllgatherOptions, opts)
        return self._run(
            "allgather_coalesced", self._backend.allgather_coalesced, (output_lists, input_list, opts), result=output_lists
        )

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = _options(c10d.GatherOptions, opts)
        return self._run("gather", self._backend.gather, (output_tensors, input_tensors, opts), result=output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = _options(c10d.ScatterOptions, opts)
        return self._run("scatter", self._backend.scatter, (output_tensors, input_tensors, opts), result=output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = _options(c10d.ReduceScatterOptions, opts)
        return self._run("reduce_scatter", self._backend.reduce_scatter, (output_tensors, input_tensors, opts))

    def reduce_scatter_single(self, output, input, opts=None):
        """``reduce_scatter_tensor``."""
        opts = _options(c10d.ReduceScatterOptions, opts)
        return self._run("reduce_scatter_tensor", self._backend._reduce_scatter_base, (output, input, opts))

    # The coalesced forms DTensor's functional collectives call from C++
    # (_c10d_functional.all_gather_into_tensor, reduce_scatter_tensor and their
    # _coalesced forms reach ProcessGroup::all_gather_single_coalesced and
    # reduce_scatter_single_coalesced, which the trampoline forwards here). Without
    # them, C++ would ask the group for an openreg backend, and there is none.

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """``all_gather_into_tensor_coalesced``: outputs[i] gathers every rank's inputs[i]."""
        opts = _options(c10d.AllgatherOptions, opts)
        return self._run(
            "all_gather_into_tensor_coalesced", self._gloo_group.all_gather_single_coalesced,
            (outputs, inputs, opts), result=outputs,
        )

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """``reduce_scatter_tensor_coalesced``: outputs[i] gets its chunk of inputs[i] reduced."""
        opts = _options(c10d.ReduceScatterOptions, opts)
        return self._run(
            "reduce_scatter_tensor_coalesced", self._gloo_group.reduce_scatter_single_coalesced,
            (outputs, inputs, opts),
        )

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = _options(c10d.AllToAllOptions, opts)
        return self._run("alltoall", self._backend.alltoall, (output_tensors, input_tensors, opts), result=output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = _options(c10d.AllToAllOptions, opts)
        return self._run(
            "all_to_all_single",
            self._backend.alltoall_base,
            (output, input, output_split_sizes, input_split_sizes, opts),
            result=[output],
        )

    def barrier(self, opts=None):
        return _Work("barrier", _calling("barrier", self._backend.barrier, (_options(c10d.BarrierOptions, opts),)))

    def send(self, tensors, dst, tag=0):
        return self._run("send", self._backend.send, (tensors, dst, tag), writes_first=False)

    def recv(self, tensors, src, tag=0):
        return self._run("recv", self._backend.recv, (tensors, src, tag))

    def recv_anysource(self, tensors, tag=0):
        return self._run("recv", self._backend.recv_anysource, (tensors, tag))


class _Work(dist.Work):
    """What a collective of this group returns: gloo's work on the aliases, whose
    ``wait()`` raises gloo's error under the collective's name, and whose future has
    ``result`` (the openreg tensors, not their aliases) as its value.

    Not ``c10d._create_work_from_future``: in torch 2.13 that work's ``wait()`` returns
    normally when its future holds an error, so a collective whose peer died would
    leave its output unwritten without a word. C++ callers (functional collectives,
    DDP's reducer) reach ``wait`` and ``get_future`` through torch's ``PyWork``
    trampoline (torch/csrc/distributed/c10d/PyProcessGroup.hpp). The future is made
    when asked for: its Python callback runs on gloo's thread, which then competes for
    the GIL, and ``async_op=False`` only waits.
    """

    def __init__(self, op: str, work: dist.Work | None = None, result: Any = None) -> None:
        super().__init__()
        self._op, self._work, self._result = op, work, result
        self._future: torch.futures.Future | None = None
        self._source: int | None = None

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        if self._work is not None:
            try:
                self._work.wait(timeout)
            except Exception as e:
                raise _named(self._op, e) from None
            self._release()
        return True

    def _release(self) -> None:
        """Lets go of gloo's work once it is done: it holds the CPU aliases, and a work
        the caller keeps (the loop variable of ``for w in works: w.wait()``) would keep
        them from ``_retire`` until the exit wait times out."""
        if self._op == "recv":
            self._source = self._work._source_rank()  # the rank it came from
        self._work = None

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            if self._work is None:
                self._future = torch.futures.Future()
                self._future.set_result([] if self._result is None else self._result)
            elif self._result is None:
                return self._work.get_future()  # gloo's, or its error: it has none
            else:
                self._future = self._work.get_future().then(_result_of(self._op, self._result))
        return self._future

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        if self._work is not None and self._work.is_completed() and not self._work.is_success():
            return _named(self._op, self._work.exception())
        return None

    def _source_rank(self) -> int:
        return self._work._source_rank() if self._work is not None else self._source

    def source_rank(self) -> int:
        return self._source_rank()

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return [] if self._result is None else self._result

    def synchronize(self) -> None:
        self.wait()


def _named(op: str, error: BaseException) -> BaseException:
    """``error`` (gloo's: "Connection closed by peer", "Timed out waiting 5000ms for recv
    operation to complete", ...) with the collective it interrupted named first, as the
    same kind of exception (``DistBackendError`` stays one)."""
    prefix = f"{BACKEND_NAME} {op}: "
    if str(error).startswith(prefix):
        return error
    try:
        named = type(error)(prefix + str(error))
    except Exception:
        named = RuntimeError(prefix + str(error))
    return named


def _calling(op: str, call: Callable[..., dist.Work], args: tuple[Any, ...]) -> dist.Work:
    """``call(*args)``, with an error gloo raises at once (sizes it refuses) named."""
    try:
        return call(*args)
    except Exception as e:
        raise _named(op, e) from None


def _result_of(op: str, result: Any) -> Callable[[torch.futures.Future], Any]:
    def value(done: torch.futures.Future) -> Any:
        try:
            done.value()
        except Exception as e:
            raise _named(op, e) from None
        return result

    return value


# Every live group, drained before the interpreter finalises (see _retire); atexit
# handlers run while it is still whole.
_GROUPS: weakref.WeakSet[ProcessGroupOpenRegGloo] = weakref.WeakSet()


@atexit.register
def _drain_all_groups() -> None:
    for group in list(_GROUPS):
        group._drain()


def _is_tensors(arg: Any) -> bool:
    """A tensor or a (nested, possibly empty) list of tensors: an argument to alias."""
    if isinstance(arg, torch.Tensor):
        return True
    return isinstance(arg, (list, tuple)) and all(_is_tensors(a) for a in arg)


def _options(kind: type, opts: Any) -> Any:
    return kind() if opts is None else opts


def _create(backend_options: Any, pg_options: Any) -> ProcessGroupOpenRegGloo:
    """The creator c10d calls (``extended_api=True``: it passes the group's name and
    global ranks, which gloo records, and ``init_process_group(pg_options=...)``)."""
    return ProcessGroupOpenRegGloo(
        backend_options.store,
        backend_options.group_rank,
        backend_options.group_size,
        backend_options.timeout,
        options=pg_options,
        group_name=backend_options.group_id,
        global_ranks_in_group=list(backend_options.global_ranks_in_group),
    )


def _register_backend() -> None:
    """Makes ``openreg_gloo`` the default c10d backend of the device type ``openreg``.

    ``register_backend(devices=...)`` fills ``Backend.default_device_backend_map`` for
    device types without a default (openreg), which ``init_process_group()`` without a
    backend uses for ``torch.accelerator``'s type, and leaves ``cpu: gloo`` alone. Listing
    ``cpu`` too states that the group serves CPU tensors
    (``Backend.backend_capability``), so ``init_process_group("openreg_gloo")`` creates
    it once for both device types.
    """
    if not dist.is_available() or not dist.is_gloo_available():
        return
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["openreg", "cpu"])
