"""Children of tests/test_ipc.py: module level, so that spawn and forkserver can
pickle them by name. Each reports through `results` ("ok", value) or
("error", "<Type>: <message>") and never blocks without a timeout."""

from __future__ import annotations

import traceback

import torch

import torch_openreg  # noqa: F401

TIMEOUT = 60


def _report(results, fn, *args) -> None:
    try:
        results.put(("ok", fn(*args)))
    except BaseException as e:  # the parent decides
        results.put(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _runtime_used(device: int) -> int:
    free, total = torch.openreg.mem_get_info(device)
    return total - free


def describe(inbox, results) -> None:
    """Receives one object, reports what it is and holds it until told to let go."""

    def run():
        obj = inbox.get(timeout=TIMEOUT)
        if isinstance(obj, torch.Tensor):
            return {
                "device": str(obj.device),
                "values": obj.cpu().tolist(),
                "size": list(obj.size()),
                "stride": list(obj.stride()),
                "offset": obj.storage_offset(),
                "dtype": str(obj.dtype),
                "requires_grad": obj.requires_grad,
                "is_leaf": obj.is_leaf,
                "storage_nbytes": obj.untyped_storage().nbytes(),
            }
        if isinstance(obj, torch.UntypedStorage):
            return {"device": str(obj.device), "bytes": list(obj.cpu())}
        if isinstance(obj, (list, tuple)):
            return {
                "same_storage": len({t.untyped_storage().data_ptr() for t in obj}) == 1,
                "values": [t.cpu().tolist() for t in obj],
            }
        return {"type": type(obj).__name__}

    _report(results, run)


def describe_arguments(results, *tensors) -> None:
    """Reports the values and device of each tensor passed as the process's arguments."""
    _report(results, lambda: [{"device": str(x.device), "values": x.cpu().tolist()} for x in tensors])


def writer(inbox, results, control) -> None:
    """Receives a tensor, fills it with 7 on its device, synchronises, reports;
    then waits for the parent's write and reports the values it reads."""

    def run():
        x = inbox.get(timeout=TIMEOUT)
        x.fill_(7)
        torch.openreg.synchronize()
        results.put(("ok", "written"))
        assert control.get(timeout=TIMEOUT) == "parent wrote"
        torch.openreg.synchronize()
        return x.cpu().tolist()

    _report(results, run)


def holder(inbox, results, control) -> None:
    """Receives a tensor, reports the runtime's used bytes and its values, lets go on
    the parent's word, reports the used bytes again."""

    def run():
        before = _runtime_used(0)
        x = inbox.get(timeout=TIMEOUT)
        results.put(("ok", {"used_before": before, "used_holding": _runtime_used(0), "values": x.cpu().tolist()}))
        assert control.get(timeout=TIMEOUT) == "let go"
        del x
        return {"used_after": _runtime_used(0)}

    _report(results, run)


def forwarder(inbox, outbox, results, control) -> None:
    """Receives a tensor and sends it on to another process (memory it did not
    allocate), keeping it until told to let go."""

    def run():
        x = inbox.get(timeout=TIMEOUT)
        outbox.put(x)
        assert control.get(timeout=TIMEOUT) == "let go"
        del x
        torch.openreg.ipc_collect()
        return "released"

    _report(results, run)


def early_producer(outbox, results, control=None) -> None:
    """Sends a tensor and exits without waiting for the receiver to let go (but,
    given `control`, after the receiver said it took the message: the file
    descriptors come from this process's resource sharer)."""

    def run():
        x = torch.arange(1 << 16, dtype=torch.float32, device="openreg") * 3
        outbox.put(x)
        return float(x.sum().item())

    _report(results, run)
    if control is not None:
        control.get(timeout=TIMEOUT)


def producer_of_views(outbox, results, control) -> None:
    """Sends views of one storage, waits for the parent to be done."""

    def run():
        base = torch.arange(64, dtype=torch.float32, device="openreg")
        outbox.put([base, base[3:40:2], base.view(8, 8).t()])
        assert control.get(timeout=TIMEOUT) == "done"
        return "done"

    _report(results, run)


def resender(inbox, results) -> None:
    """Receives a tensor and sends it back through a pipe connection (pickled in this thread)."""

    def run():
        conn = inbox.get(timeout=TIMEOUT)
        x = conn.recv()
        x.add_(1)
        torch.openreg.synchronize()
        conn.send(x)
        assert conn.poll(TIMEOUT) and conn.recv() == "done"
        return "done"

    _report(results, run)


class OpenRegSquares(torch.utils.data.Dataset):
    """(i, [i*i] * 3) with the squares computed on openreg, in the worker."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        v = torch.full((3,), float(i), device="openreg")
        return i, v * v
