"""The machinery of torch.openreg.sanitizer (docs/integration/streams.md, "Sanitizer").

It is torch.cuda._sanitizer (CSAN) applied to openreg: CSAN's vector clocks
(``EventHandler.syncs``, fed by the GPU trace through
torch_openreg/openreg/_gpu_trace.py), its walk over an operator's schema
(``ArgumentHandler``), its access records and its report. What differs:

- Memory is keyed by storage, and each access carries the bytes of the
  storage it spans: CSAN keys by ``data_ptr()``, so a view at another offset
  is other memory to it (a race through ``x[1:]`` goes unseen) while two
  disjoint slices of one buffer written on two streams are no race.
- The stream of an operator is the current stream of its tensors' device,
  named by its runtime handle as the trace names it.
- Two more checks: memory freed while a stream other than its allocation
  stream may still use it (no ``record_stream``), and host reads of the
  destination of a ``non_blocking`` device-to-host copy before a
  synchronisation.

Importing this module imports CSAN, whose module activates c10's GPU trace
for good (it makes a ``CUDASanitizer``, which calls
``torch._C._activate_gpu_trace()``): only ``sanitizer.enable()`` imports it.
"""

from __future__ import annotations

import functools
import sys
import threading
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.cuda._sanitizer import (
    FACTORY_FUNCTION_REGEX,
    Access,
    AccessType,
    ArgumentHandler,
    CUDASanitizerErrors,
    EventHandler,
    SynchronizationError,
    UnsynchronizedAccessError,
)
from torch.utils._python_dispatch import TorchDispatchMode

from torch_openreg import _C
from torch_openreg.openreg import _gpu_trace

aten = torch.ops.aten

Range = tuple[int, int]  # [begin, end) bytes of a storage

# torch.Tensor's own __torch_dispatch__ (torch/_tensor.py): a class with
# another one (FakeTensor, FunctionalTensor, DTensor) wraps tensors that are
# seen when it dispatches on them; its own storage may not exist.
_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


class StreamKey(int):
    """A stream as the GPU trace names it (its runtime handle), printed as
    ``openreg:D stream N``: CSAN's report formats ``Access.stream``."""

    device: int
    stream_id: int

    def __new__(cls, handle: int, device: int, stream_id: int) -> StreamKey:
        key = super().__new__(cls, handle)
        key.device = device
        key.stream_id = stream_id
        return key

    def __str__(self) -> str:
        return f"openreg:{self.device} stream {self.stream_id}"

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


@dataclass
class RangedAccess(Access):
    """CSAN's Access with the bytes of the storage it spans."""

    ranges: list[Range] = field(default_factory=list)


@dataclass
class Memory:
    """One block the caching allocator handed a storage, and who used it."""

    allocation_stack: traceback.StackSummary | None
    allocation_stream: StreamKey | None = None
    # Accesses a later one may still race with; superseded ones are dropped.
    accesses: list[RangedAccess] = field(default_factory=list)
    recorded_streams: set[int] = field(default_factory=set)  # record_stream


@dataclass
class PendingCopy:
    """A non_blocking device-to-host copy writing a pinned host storage."""

    copy: RangedAccess
    storage: weakref.ref  # dead once the host memory is freed (and may be reused)


def _plumbing_files() -> frozenset[str]:
    """Files of the frames between a program's line and this module: the
    dispatch of an operator to a mode and of a trace hook to its callbacks."""
    import torch._compile
    import torch._dynamo.eval_frame
    import torch._ops
    import torch._utils
    import torch.utils._python_dispatch

    modules = (torch._compile, torch._dynamo.eval_frame, torch._ops, torch._utils, torch.utils._python_dispatch)
    return frozenset([__file__, *(m.__file__ for m in modules)])


_PLUMBING = _plumbing_files()


def _stack() -> traceback.StackSummary:
    """The caller's Python stack, outermost frame first, without the sanitizer's
    own frames and the dispatch plumbing that leads to them."""
    frames = [
        (f, line) for f, line in traceback.walk_stack(sys._getframe(1)) if f.f_code.co_filename not in _PLUMBING
    ]
    frames.reverse()
    return traceback.StackSummary.extract(frames, lookup_lines=False)


def _format_access(access: Access) -> str:
    names = f" argument(s) {', '.join(access.aliases)}" if access.aliases else ""
    return f"{access.operator}\n{access.type}{names}\nWith stack trace:\n{''.join(access.stack_trace.format())}"


def _overlap(a: list[Range], b: list[Range]) -> bool:
    return any(lo < b_hi and b_lo < hi for lo, hi in a for b_lo, b_hi in b)


def _covers(a: list[Range], b: list[Range]) -> bool:
    return all(any(lo <= b_lo and b_hi <= hi for lo, hi in a) for b_lo, b_hi in b)


def _locate(t: torch.Tensor) -> tuple[int, Range, Any] | None:
    """(storage address, bytes of the storage ``t`` spans, the storage), or
    None for a tensor with no memory."""
    try:
        if t.numel() == 0:
            return None
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0:
            return None
        try:
            size = t.element_size()
            begin = t.storage_offset() * size
            span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
            return ptr, (begin, begin + span * size), storage
        except RuntimeError:  # no strides (nested tensors): all of it
            return ptr, (0, storage.nbytes()), storage
    except (RuntimeError, NotImplementedError):  # no storage (sparse)
        return None


def _describe(t: torch.Tensor) -> str:
    return f"the {t.device} tensor of shape {tuple(t.shape)} and dtype {t.dtype}"


class OpenRegAccessError(UnsynchronizedAccessError):
    """CSAN's data race report, naming the tensor and the fix."""

    def __init__(self, data_ptr: int, allocation_stack, current: Access, previous: Access, tensor: str):
        super().__init__(data_ptr, allocation_stack, current, previous)
        self.tensor = tensor

    def __str__(self) -> str:
        now, then = self.current_access.stream, self.previous_access.stream
        return (
            f"{super().__str__()}\nThe memory is {self.tensor}'s (storage at {self.data_ptr}).\n"
            f"Fix: make {now} wait for {then} before the access (`with torch.openreg.stream(a): "
            f"a.wait_stream(b)`, or an Event recorded on {then} and waited on {now}), or synchronize "
            f"{then} first.\n"
        )


class FreedWhileInUseError(SynchronizationError):
    """Device memory freed while a stream other than its allocation stream may still access it."""

    def __init__(self, data_ptr: int, memory: Memory, access: Access, free_stack: traceback.StackSummary):
        self.data_ptr = data_ptr
        self.memory = memory
        self.access = access
        self.free_stack = free_stack

    def __str__(self) -> str:
        home, other = self.memory.allocation_stream, self.access.stream
        allocated = (
            "".join(self.memory.allocation_stack.format()) if self.memory.allocation_stack else "not seen\n"
        )
        return (
            "============================\n"
            f"openreg sanitizer: device memory at {self.data_ptr}, allocated on {home}, was freed while "
            f"{other} may still access it: the caching allocator can hand it out again on {home} "
            f"before {other}'s work has run.\n"
            f"Unsynchronized access by {other} during kernel:\n{_format_access(self.access)}\n"
            f"Freed with stack trace:\n{''.join(self.free_stack.format())}\n"
            f"Allocated with stack trace:\n{allocated}\n"
            f"Fix: call tensor.record_stream(s) with s = {other} after using the tensor there, or make "
            f"{home} wait for {other} (wait_stream, or an Event), or synchronize, before the tensor "
            "is freed.\n"
        )


class UnsynchronizedHostReadError(SynchronizationError):
    """Host code read the destination of a non_blocking device-to-host copy before synchronising."""

    def __init__(self, data_ptr: int, copy: Access, reader: str, read_stack: traceback.StackSummary):
        self.data_ptr = data_ptr
        self.copy = copy
        self.reader = reader
        self.read_stack = read_stack

    def __str__(self) -> str:
        stream = self.copy.stream
        return (
            "============================\n"
            f"openreg sanitizer: {self.reader} read host memory at {self.data_ptr} that a non_blocking "
            f"device-to-host copy on {stream} writes, before the host synchronized with {stream}: "
            "the copy may not have run yet.\n"
            f"The copy, on {stream} during kernel:\n{_format_access(self.copy)}\n"
            f"Host read with stack trace:\n{''.join(self.read_stack.format())}\n"
            f"Fix: synchronize {stream} (stream.synchronize()), an Event recorded after the copy "
            "(event.synchronize()) or the device (torch.openreg.synchronize()) before reading.\n"
        )


class Arguments(ArgumentHandler):
    """CSAN's walk over an operator's schema and arguments (parse_inputs,
    parse_outputs), collecting the bytes of the storages each tensor spans."""

    def __init__(self, watch_host: bool) -> None:
        super().__init__()
        self.reads: dict[int, list[Range]] = {}
        self.writes: dict[int, list[Range]] = {}
        self.tensors: dict[int, torch.Tensor] = {}
        self.device: int | None = None  # of the first openreg tensor
        self.write_device: int | None = None  # of the first one written
        self.watch_host = watch_host
        self.host: dict[int, list[Range]] = {}  # CPU storages read or written

    def _handle_argument(
        self, value: Any, is_write: bool, metadata_only: bool, name: str | None = None, is_output: bool = False
    ) -> None:
        if not isinstance(value, torch.Tensor):
            return
        cls = type(value)
        if cls is not torch.Tensor and cls.__torch_dispatch__ is not _PLAIN_DISPATCH:
            return
        kind = value.device.type
        if kind == "openreg":
            located = _locate(value)
            if located is None:
                return
            ptr, span, _ = located
            if is_write:
                self.writes.setdefault(ptr, []).append(span)
                if self.write_device is None:
                    self.write_device = value.device.index
            elif not metadata_only:
                self.reads.setdefault(ptr, []).append(span)
            if self.device is None:
                self.device = value.device.index
            names = self.tensor_aliases.setdefault(ptr, [])
            if name is not None:
                names.append(name)
            if is_output:
                self.outputs.add(ptr)
            self.tensors.setdefault(ptr, value)
        elif kind == "cpu" and self.watch_host and not metadata_only:
            located = _locate(value)
            if located is not None:
                self.host.setdefault(located[0], []).append(located[1])


class Handler(EventHandler):
    """CSAN's EventHandler (its stream synchronisation state, its trace
    callbacks for events and streams) with openreg's three checks."""

    def __init__(self) -> None:
        super().__init__()
        self.memory: dict[int, Memory] = {}
        self.host_pending: dict[int, list[PendingCopy]] = {}
        self.deferred: list[SynchronizationError] = []
        self.streams: dict[tuple[int, int], StreamKey] = {}
        # Synchronisations reported while this thread's operator runs: the
        # operator's own accesses are recorded after it returns, and a
        # synchronous copy is ordered before what follows it.
        self.local = threading.local()

    # --- streams -----------------------------------------------------------

    def stream_key(self, device: int, stream_id: int) -> StreamKey:
        key = self.streams.get((device, stream_id))
        if key is None:
            key = StreamKey(_C._stream_handle(stream_id, device), device, stream_id)
            self.streams[(device, stream_id)] = key
        return key

    def current_stream(self, device: int) -> StreamKey:
        return self.stream_key(device, _C._current_stream_id(device))

    # --- trace callbacks (torch_openreg/openreg/_gpu_trace.py) -------------

    def _handle_memory_allocation(self, data_ptr: int) -> None:
        # No stack here: an allocation is as frequent as an operator, and the
        # operator that allocated the memory records it as its first access.
        device, stream_id = _C._allocation_stream(data_ptr)
        if _C._is_current_stream_capturing(device):
            # A graph's memory: what the graph does with it is not seen (SanitizerMode).
            self.memory[data_ptr] = Memory(None)
            return
        self.memory[data_ptr] = Memory(None, self.stream_key(device, stream_id))

    def _handle_memory_deallocation(self, data_ptr: int) -> None:
        memory = self.memory.pop(data_ptr, None)
        if memory is None or memory.allocation_stream is None:
            return
        home = memory.allocation_stream
        for access in reversed(memory.accesses):
            if access.stream == home or access.stream in memory.recorded_streams:
                continue
            if not self.syncs.is_ordered_after(home, access.seq_num, access.stream):
                error = FreedWhileInUseError(data_ptr, memory, access, _stack())
                # A callback cannot raise through the trace hook (CallbackRegistry
                # logs exceptions): print now, raise from the next operator.
                print(error, file=sys.stderr)
                self.deferred.append(error)
                return

    def _note_sync(self, handle: Callable[..., None], *args: Any) -> None:
        handle(*args)
        pending = getattr(self.local, "syncs", None)
        if pending is not None:
            pending.append((handle, args))

    def _handle_stream_synchronization(self, stream: int) -> None:
        self._note_sync(super()._handle_stream_synchronization, stream)

    def _handle_event_synchronization(self, event: int) -> None:
        self._note_sync(super()._handle_event_synchronization, event)

    def _handle_device_synchronization(self) -> None:
        self._note_sync(super()._handle_device_synchronization)

    # --- operators -----------------------------------------------------------

    def begin_operator(self) -> list | None:
        outer = getattr(self.local, "syncs", None)
        self.local.syncs = []
        return outer

    def end_operator(self, outer: list | None) -> list:
        syncs, self.local.syncs = self.local.syncs, outer
        return syncs

    def _superseded(self, old: RangedAccess, new: RangedAccess) -> bool:
        """Whether every later access that races with ``old`` races with ``new`` too."""
        if self.syncs.host_sync_state.get(old.stream, -1) >= old.seq_num:
            return True  # the host waited for it: everything later is ordered after it
        return (
            (new.type is AccessType.WRITE or old.type is AccessType.READ)
            and _covers(new.ranges, old.ranges)
            and self.syncs.is_ordered_after(new.stream, old.seq_num, old.stream)
        )

    def launch(self, stream: StreamKey, arguments: Arguments, operator: Any) -> list[SynchronizationError]:
        """Records an operator's accesses on ``stream``; returns the races they make."""
        self.seq_num += 1
        self.syncs.update_seq_num(stream, self.seq_num)
        stack = _stack()
        errors: list[SynchronizationError] = []
        for ptr in arguments.reads.keys() | arguments.writes.keys():
            written = ptr in arguments.writes
            access = RangedAccess(
                AccessType.WRITE if written else AccessType.READ,
                self.seq_num,
                stream,
                operator,
                arguments.tensor_aliases.get(ptr, []),
                ptr in arguments.outputs,
                stack,
                arguments.writes.get(ptr, []) + arguments.reads.get(ptr, []),
            )
            memory = self.memory.get(ptr)
            if memory is None:  # allocated before enable(), or inside a kernel
                memory = self.memory[ptr] = Memory(None)
            if memory.allocation_stream is not None and memory.allocation_stack is None and not memory.accesses:
                memory.allocation_stack = stack
            for previous in reversed(memory.accesses):
                if not written and previous.type is AccessType.READ:
                    continue
                if _overlap(previous.ranges, access.ranges) and not self.syncs.is_ordered_after(
                    stream, previous.seq_num, previous.stream
                ):
                    errors.append(
                        OpenRegAccessError(
                            ptr, memory.allocation_stack, access, previous, _describe(arguments.tensors[ptr])
                        )
                    )
                    break
            memory.accesses = [a for a in memory.accesses if not self._superseded(a, access)]
            memory.accesses.append(access)
        return errors

    def record_stream(self, tensor: torch.Tensor, stream: torch.Stream) -> None:
        located = _locate(tensor) if tensor.device.type == "openreg" else None
        if located is None:
            return
        memory = self.memory.setdefault(located[0], Memory(None))
        memory.recorded_streams.add(self.stream_key(stream.device_index, stream.stream_id))

    # --- host reads of non_blocking device-to-host copies ---------------------

    def add_pending_copy(self, destination: torch.Tensor, stream: StreamKey, operator: Any) -> None:
        located = _locate(destination)
        if located is None:
            return
        ptr, span, storage = located
        copy = RangedAccess(AccessType.WRITE, self.seq_num, stream, operator, [], True, _stack(), [span])
        self.host_pending.setdefault(ptr, []).append(PendingCopy(copy, weakref.ref(storage)))

    def check_host_access(
        self, host: dict[int, list[Range]], reader: str, ordered_stream: int | None = None
    ) -> list[SynchronizationError]:
        """Races of host reads and writes of ``host`` with pending copies.
        ``ordered_stream``: the stream of an asynchronous copy making the access,
        which is in stream order with copies queued there before."""
        errors: list[SynchronizationError] = []
        for ptr, spans in host.items():
            pending = self.host_pending.get(ptr)
            if not pending:
                continue
            left = []
            for entry in pending:
                copy = entry.copy
                if entry.storage() is None or self.syncs.host_sync_state.get(copy.stream, -1) >= copy.seq_num:
                    continue  # freed, or the host waited for it
                left.append(entry)
                if not errors and copy.stream != ordered_stream and _overlap(copy.ranges, spans):
                    errors.append(UnsynchronizedHostReadError(ptr, copy, reader, _stack()))
            if left:
                self.host_pending[ptr] = left
            else:
                del self.host_pending[ptr]
        return errors

    def take_deferred(self) -> list[SynchronizationError]:
        errors, self.deferred = self.deferred, []
        return errors


def _non_blocking_copy(func: Any, args: tuple, kwargs: dict) -> bool:
    if func is aten.copy_.default:
        return bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if func is aten._to_copy.default:
        return bool(kwargs.get("non_blocking", False))
    return False


def _copy_destination(func: Any, args: tuple, outputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, destination) of copy_ or _to_copy."""
    return (args[1], args[0]) if func is aten.copy_.default else (args[0], outputs)


# Operators that look at a tensor's metadata, not its data: no access. CSAN
# counts them as reads; that is wrong only when another stream writes the
# data meanwhile, which a correct program may do.
_METADATA_ONLY = frozenset(
    [
        aten.is_pinned.default,
        aten.is_same_size.default,
        aten._has_compatible_shallow_copy_type.default,
        aten.is_coalesced.default,
        aten.sym_size.default,
        aten.sym_stride.default,
        aten.sym_numel.default,
        aten.sym_storage_offset.default,
    ]
)


class SanitizerMode(TorchDispatchMode):
    """Like CSAN's CUDASanitizerDispatchMode: each operator is a kernel launch
    on the current stream of its device, checked against the accesses before."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = self.handler
        if func is aten.record_stream.default:
            result = func(*args, **kwargs)  # first: it rejects a stream of another device
            handler.record_stream(args[0], args[1])
            return result
        if func in _METADATA_ONLY:
            return func(*args, **kwargs)
        if _C._is_current_stream_capturing():
            # Recorded into a graph, not run: its accesses happen at the
            # replays, which the sanitizer does not see (docs/integration/streams.md).
            return func(*args, **kwargs)
        errors = handler.take_deferred()  # printed when they were found
        printed = len(errors)
        is_factory = bool(FACTORY_FUNCTION_REGEX.match(func._schema.name))
        arguments = Arguments(watch_host=bool(handler.host_pending))
        arguments.parse_inputs(func._schema, args, kwargs, is_factory=is_factory)
        non_blocking = _non_blocking_copy(func, args, kwargs)
        if arguments.host:
            ordered = (
                handler.current_stream(arguments.device)
                if non_blocking and arguments.device is not None
                else None
            )
            errors += handler.check_host_access(arguments.host, str(func._schema.name), ordered)

        outer = handler.begin_operator()
        try:
            outputs = func(*args, **kwargs)
        finally:
            syncs = handler.end_operator(outer)

        arguments.parse_outputs(func._schema, outputs, is_factory=is_factory)
        device = arguments.write_device if arguments.write_device is not None else arguments.device
        if device is not None and (arguments.reads or arguments.writes):
            stream = handler.current_stream(device)
            errors += handler.launch(stream, arguments, func._schema)
            if non_blocking:
                source, destination = _copy_destination(func, args, outputs)
                if (
                    source.device.type == "openreg"
                    and destination.device.type == "cpu"
                    and destination.is_pinned()  # a pageable destination is copied synchronously
                ):
                    handler.add_pending_copy(destination, stream, func._schema)
        for handle, handle_args in syncs:
            handle(*handle_args)
        if errors:
            for error in errors[printed:]:
                print(error, file=sys.stderr)
            raise CUDASanitizerErrors(errors)
        return outputs


_HOST_READERS = ("numpy", "tolist")


class Sanitizer:
    """One enabled sanitizer: the mode, the trace callbacks and the host-read wrappers."""

    def __init__(self) -> None:
        self.handler = Handler()
        self.mode = SanitizerMode(self.handler)
        handler = self.handler
        self.callbacks = [
            (_gpu_trace.EventCreationCallbacks, handler._handle_event_creation),
            (_gpu_trace.EventDeletionCallbacks, handler._handle_event_deletion),
            (_gpu_trace.EventRecordCallbacks, handler._handle_event_record),
            (_gpu_trace.EventWaitCallbacks, handler._handle_event_wait),
            (_gpu_trace.MemoryAllocationCallbacks, handler._handle_memory_allocation),
            (_gpu_trace.MemoryDeallocationCallbacks, handler._handle_memory_deallocation),
            (_gpu_trace.StreamCreationCallbacks, handler._handle_stream_creation),
            (_gpu_trace.DeviceSynchronizationCallbacks, handler._handle_device_synchronization),
            (_gpu_trace.StreamSynchronizationCallbacks, handler._handle_stream_synchronization),
            (_gpu_trace.EventSynchronizationCallbacks, handler._handle_event_synchronization),
        ]
        self.replaced: dict[str, Any] = {}

    def enable(self) -> None:
        torch._C._activate_gpu_trace()
        _C._set_gpu_trace(True)
        for registry, callback in self.callbacks:
            registry.add_callback(callback)
        # Tensor.numpy() and Tensor.tolist() read CPU memory without dispatching
        # an operator (torch/csrc/utils/tensor_numpy.cpp, tensor_list.cpp).
        for name in _HOST_READERS:
            self.replaced[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._host_reader(name, getattr(torch.Tensor, name)))
        self.mode.__enter__()

    def disable(self) -> None:
        self.mode.__exit__(None, None, None)
        for name, previous in self.replaced.items():
            if previous is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, previous)
        self.replaced.clear()
        for registry, callback in self.callbacks:
            registry.callback_list.remove(callback)
        _C._set_gpu_trace(False)

    def _host_reader(self, name: str, read: Callable[..., Any]) -> Callable[..., Any]:
        handler = self.handler

        @functools.wraps(read)
        def checked(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if handler.host_pending and tensor.device.type == "cpu":
                located = _locate(tensor)
                if located is not None:
                    errors = handler.check_host_access({located[0]: [located[1]]}, f"Tensor.{name}()")
                    if errors:
                        for error in errors:
                            print(error, file=sys.stderr)
                        raise CUDASanitizerErrors(errors)
            return read(tensor, *args, **kwargs)

        return checked
