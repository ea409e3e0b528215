"""openreg tensors and storages through ``torch.multiprocessing``, as CUDA IPC.

torch's pickler for multiprocessing (``torch/multiprocessing/reductions.py``)
reduces a tensor to its storage plus size, stride and offset, and a storage
with ``_share_cuda_`` (CUDA) or ``_share_fd_cpu_`` (anything else, which fails
for openreg). This module registers a reducer for ``torch.UntypedStorage`` that
takes openreg storages and hands every other one to torch's: a tensor then
arrives as a view of the same device memory (torch's ``rebuild_tensor`` keeps
size, stride, offset and ``requires_grad``, and refuses a non-leaf that
requires grad), and a storage as the same memory.

How (docs/integration/ipc.md):

- the sender waits for the storage's device (``torch.openreg.synchronize``),
  so the receiver sees what was queued before the send, and exports the
  runtime allocation around the storage (``orIpcGetMemHandle``: the memory
  file behind the device memory and the range of it);
- the file descriptors travel as ``multiprocessing.reduction.DupFd`` does it
  (torch's CPU storages with the ``file_descriptor`` strategy), both over one
  connection to the sender's resource sharer (``_FdPair``);
- the receiver maps the range into its own device memory
  (``orIpcOpenMemHandle``); its storage's deleter unmaps it and decrements a
  count in shared memory that the sender set to 1;
- the sender keeps the storage alive until the count reaches 0, which
  ``ipc_collect()`` (and every later send) checks, as CUDA's ref counter file
  and ``torch.cuda.ipc_collect``.
"""

from __future__ import annotations

import os
import socket
import threading
from multiprocessing import context, reduction, resource_sharer
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _torch_reductions
from torch.multiprocessing.reductions import StorageWeakRef

from torch_openreg import _C

__all__ = ["ipc_collect"]

# Sends whose receivers may still hold the memory: (_C._IpcSentStorage, each
# holding its storage; the descriptor a new process inherits for it, or None).
_sent: list = []
_sent_lock = threading.Lock()

# Storages this process sent or received, by the bytes they are in the
# producer's memory: a storage that arrives twice (two tensors of one
# storage, sent in one message or two) is one storage in the receiver, and
# one that comes back to its producer is the original, as torch's
# shared_cache does for CUDA handles.
_storages: dict[tuple, StorageWeakRef] = {}
_storages_lock = threading.Lock()


def ipc_collect() -> None:
    """Releases the openreg memory of sent storages every receiver has let go of.

    As ``torch.cuda.ipc_collect``: a process that sent openreg tensors to
    others keeps each storage alive until every receiver freed it; this drops
    the ones they have (later sends do it too), so their memory returns to the
    caching allocator. It does not wait for receivers that still hold theirs.
    """
    with _sent_lock:
        kept, released = [], []
        for entry in _sent:
            (released if entry[0].released() else kept).append(entry)
        _sent[:] = kept
    for _, inherited in released:
        if inherited is not None:
            os.close(inherited)
    with _storages_lock:
        for key in [key for key, ref in _storages.items() if ref.expired()]:
            del _storages[key]


def _key(process: int, memory: int, offset: int, nbytes: int) -> tuple:
    return ("openreg", process, memory, offset, nbytes)


def _cached(key: tuple) -> torch.UntypedStorage | None:
    with _storages_lock:
        ref = _storages.get(key)
        if ref is None or ref.expired():
            return None
        return torch.UntypedStorage._new_with_weak_ptr(ref.cdata)


class _FdPair:
    """Two file descriptors for the process that unpickles this.

    ``multiprocessing.reduction.DupFd`` passes one descriptor per connection to
    the sender's resource sharer, each connection with its authentication
    handshake: the receiver's largest cost. This registers both descriptors of a
    send (memory file, count file) with the same sharer
    (``multiprocessing.resource_sharer``, as its ``DupFd`` does) and sends them in
    one message of that connection.
    """

    def __init__(self, first: int, second: int) -> None:
        fds = [os.dup(first), os.dup(second)]

        def send(conn, pid):
            with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
                reduction.sendfds(s, fds)

        def close():
            for fd in fds:
                os.close(fd)

        self._id = resource_sharer._resource_sharer.register(send, close)

    def detach(self) -> tuple[int, int]:
        with resource_sharer._resource_sharer.get_connection(self._id) as conn:
            with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
                first, second = reduction.recvfds(s, 2)
        return first, second


class _ChildFdPair:
    """Two descriptors pickled as a new process's argument: they go to the child
    with it (the spawning Popen's DupFd), as ``reduction.DupFd`` does then. They
    are passed when the child starts, after pickling: they must stay open."""

    def __init__(self, first: int, second: int) -> None:
        self._fds = (reduction.DupFd(first), reduction.DupFd(second))

    def detach(self) -> tuple[int, int]:
        return self._fds[0].detach(), self._fds[1].detach()


def _rebuild_empty_storage(device: int) -> torch.UntypedStorage:
    return torch.UntypedStorage(0, device=torch.device("openreg", device))


def _rebuild_storage(fds, device, offset, size, base, process, memory, storage_offset, nbytes):
    fd, counter_fd = fds.detach()
    try:
        key = _key(process, memory, offset + base + storage_offset, nbytes)
        storage = _cached(key)
        if storage is not None:
            _C._ipc_release_send(counter_fd)  # this send adds no reference
            return storage
        storage = _C._ipc_open(fd, device, offset, size, base, process, memory, storage_offset, nbytes, counter_fd)
        with _storages_lock:
            _storages[key] = StorageWeakRef(storage)
        return storage
    finally:
        os.close(fd)
        os.close(counter_fd)


def _reduce_storage(storage: torch.UntypedStorage):
    if storage.device.type != "openreg":
        return _torch_reductions.reduce_storage(storage)
    device = storage.device.index
    if storage.nbytes() == 0:
        return (_rebuild_empty_storage, (device,))
    # The receiver reads the memory as soon as it has it: what was queued
    # before the send must have run (CUDA sends an event to wait for instead).
    torch.openreg.synchronize(device)
    sent = _C._ipc_export(storage)
    inherited = None
    if context.get_spawning_popen() is not None:
        # A descriptor of the memory file per send: storages of one device share
        # the file, and a new process refuses a descriptor passed twice. It and
        # the count file stay open until ipc_collect drops this send.
        inherited = os.dup(sent.fd)
        fds = _ChildFdPair(inherited, sent.counter_fd)
    else:
        try:
            fds = _FdPair(sent.fd, sent.counter_fd)  # duplicates them
        finally:
            sent.close_counter_fd()
    ipc_collect()
    with _sent_lock:
        _sent.append((sent, inherited))
    key = _key(sent.process, sent.memory, sent.offset + sent.base + sent.storage_offset, sent.nbytes)
    with _storages_lock:
        _storages[key] = StorageWeakRef(storage)
    return (
        _rebuild_storage,
        (
            fds,
            sent.device,
            sent.offset,
            sent.size,
            sent.base,
            sent.process,
            sent.memory,
            sent.storage_offset,
            sent.nbytes,
        ),
    )


def register() -> None:
    """Makes torch.multiprocessing's pickler share openreg storages (idempotent)."""
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
