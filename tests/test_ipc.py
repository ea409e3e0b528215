"""openreg tensors and storages between processes, as CUDA IPC: they go through
torch.multiprocessing queues and pipes and arrive as views of the same device
memory, which lives until the last process lets go.

Children run tests/ipc_workers.py under timeouts: a hang fails the test, and every
child still running at the end of a test is killed.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp

import ipc_workers
import torch_openreg  # noqa: F401

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

TIMEOUT = ipc_workers.TIMEOUT
CONTEXTS = ["spawn", "forkserver"]


class Children:
    """Starts children of one context; joins them (killing stragglers) at the end."""

    def __init__(self, method: str) -> None:
        self.ctx = mp.get_context(method)
        if method == "forkserver":
            # The fork server imports torch once; its children start with it imported (not initialised).
            self.ctx.set_forkserver_preload(["torch"])
        self.processes: list = []

    def queue(self):
        return self.ctx.Queue()

    def start(self, target, *args):
        process = self.ctx.Process(target=target, args=args, daemon=True)
        process.start()
        self.processes.append(process)
        return process

    def close(self) -> None:
        for process in self.processes:
            process.join(TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()


@pytest.fixture(autouse=True)
def leaves_the_allocator_as_found():
    """Runs after the children are joined (autouse fixtures are set up first, so
    torn down last): drops the sends whose receivers let go and empties the
    cache, so later tests in this process start from a clean pool. A send to a
    child that exited without freeing it (a Process argument: multiprocessing
    ends children with os._exit) stays allocated, as with CUDA IPC."""
    yield
    settle()
    torch.openreg.empty_cache()


@pytest.fixture(params=CONTEXTS)
def children(request):
    c = Children(request.param)
    yield c
    c.close()


@pytest.fixture
def spawned():
    c = Children("spawn")
    yield c
    c.close()


def result(results):
    """The next report of a child; fails the test on its error or on silence."""
    status, value = results.get(timeout=TIMEOUT)
    if status != "ok":
        pytest.fail(f"child failed: {value}")
    return value


def settle() -> None:
    gc.collect()
    torch.openreg.synchronize()
    torch.openreg.ipc_collect()


def runtime_used(device: int = 0) -> int:
    free, total = torch.openreg.mem_get_info(device)
    return total - free


# --- what arrives ------------------------------------------------------------------


@pytest.mark.parametrize("device", [0, 1])
def test_tensor_arrives_with_its_values_size_stride_offset_and_device(children, device):
    x = torch.randn(6, 5, device=f"openreg:{device}")[1:, ::2]
    inbox, results = children.queue(), children.queue()
    children.start(ipc_workers.describe, inbox, results)
    inbox.put(x)
    got = result(results)
    assert got["device"] == f"openreg:{device}"
    assert got["values"] == x.cpu().tolist()
    assert got["size"] == list(x.size())
    assert got["stride"] == list(x.stride())
    assert got["offset"] == x.storage_offset()
    assert got["dtype"] == str(x.dtype)
    assert got["storage_nbytes"] == x.untyped_storage().nbytes()
    assert not got["requires_grad"]


def test_tensors_passed_as_process_arguments_arrive(children):
    # Storages of one device share its memory file: a new process gets it once per tensor.
    x = torch.arange(5, dtype=torch.float64, device="openreg:1")
    results = children.queue()
    children.start(ipc_workers.describe_arguments, results, x, x + 1, x[1:3])
    assert result(results) == [
        {"device": "openreg:1", "values": [0.0, 1.0, 2.0, 3.0, 4.0]},
        {"device": "openreg:1", "values": [1.0, 2.0, 3.0, 4.0, 5.0]},
        {"device": "openreg:1", "values": [1.0, 2.0]},
    ]


def test_leaf_that_requires_grad_arrives_as_a_leaf_that_requires_grad(spawned):
    x = torch.ones(4, device="openreg", requires_grad=True)
    inbox, results = spawned.queue(), spawned.queue()
    spawned.start(ipc_workers.describe, inbox, results)
    inbox.put(x)
    got = result(results)
    assert got["requires_grad"] and got["is_leaf"]
    assert got["values"] == [1.0] * 4


def test_storage_arrives_as_the_same_bytes(children):
    storage = torch.arange(16, dtype=torch.uint8, device="openreg").untyped_storage()
    inbox, results = children.queue(), children.queue()
    children.start(ipc_workers.describe, inbox, results)
    inbox.put(storage)
    got = result(results)
    assert got == {"device": "openreg:0", "bytes": list(range(16))}


def test_empty_tensor_arrives_empty(spawned):
    inbox, results = spawned.queue(), spawned.queue()
    spawned.start(ipc_workers.describe, inbox, results)
    inbox.put(torch.empty(0, 3, device="openreg:1"))
    got = result(results)
    assert got["device"] == "openreg:1" and got["size"] == [0, 3] and got["values"] == []


def test_views_of_one_storage_arrive_as_views_of_one_storage(children):
    outbox, results, control = children.queue(), children.queue(), children.queue()
    children.start(ipc_workers.producer_of_views, outbox, results, control)
    base, strided, transposed = outbox.get(timeout=TIMEOUT)
    assert base.untyped_storage().data_ptr() == strided.untyped_storage().data_ptr()
    assert base.untyped_storage().data_ptr() == transposed.untyped_storage().data_ptr()
    assert strided.stride() == (2,) and strided.storage_offset() == 3
    assert transposed.stride() == (1, 8)
    expected = torch.arange(64, dtype=torch.float32)
    assert torch.equal(strided.cpu(), expected[3:40:2])
    assert torch.equal(transposed.cpu(), expected.view(8, 8).t())
    base.fill_(-1)  # a write through one view is seen through the others
    assert strided.cpu().eq(-1).all() and transposed.cpu().eq(-1).all()
    del base, strided, transposed
    control.put("done")
    assert result(results) == "done"


# --- one memory, two processes ----------------------------------------------------------


def test_write_in_one_process_is_seen_by_the_other_after_synchronize(children):
    x = torch.zeros(1000, device="openreg")
    inbox, results, control = children.queue(), children.queue(), children.queue()
    children.start(ipc_workers.writer, inbox, results, control)
    inbox.put(x)
    assert result(results) == "written"
    torch.openreg.synchronize()
    assert x.cpu().eq(7).all()  # the child's write, in this process's tensor
    x.add_(5)
    torch.openreg.synchronize()
    control.put("parent wrote")
    assert result(results) == [12.0] * 1000


def test_tensor_sent_back_through_a_pipe_is_the_original(spawned):
    parent_end, child_end = spawned.ctx.Pipe()
    inbox, results = spawned.queue(), spawned.queue()
    spawned.start(ipc_workers.resender, inbox, results)
    inbox.put(child_end)
    x = torch.arange(10, dtype=torch.float32, device="openreg")
    parent_end.send(x)
    assert parent_end.poll(TIMEOUT)
    back = parent_end.recv()
    assert back.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert back.cpu().tolist() == [float(i + 1) for i in range(10)]
    parent_end.send("done")
    assert result(results) == "done"


def test_four_processes_share_one_memory(spawned):
    """This process sends to a holder and to a forwarder, which sends on (memory it
    did not allocate) to a second holder: all four see the same bytes, and the
    forwarder's copy of the handle keeps working after it let go of its own."""
    x = torch.arange(1 << 12, dtype=torch.float32, device="openreg")
    first = (spawned.queue(), spawned.queue(), spawned.queue())  # inbox, results, control
    second = (spawned.queue(), spawned.queue(), spawned.queue())
    forward = (spawned.queue(), spawned.queue(), spawned.queue())
    spawned.start(ipc_workers.holder, *first)
    spawned.start(ipc_workers.holder, *second)
    spawned.start(ipc_workers.forwarder, forward[0], second[0], forward[1], forward[2])
    first[0].put(x)
    forward[0].put(x)
    expected = x.cpu().tolist()
    assert result(first[1])["values"] == expected
    assert result(second[1])["values"] == expected
    forward[2].put("let go")
    assert result(forward[1]) == "released"
    first[2].put("let go")
    second[2].put("let go")
    result(first[1])
    result(second[1])
    del x
    settle()


# --- lifetime --------------------------------------------------------------------------


def test_memory_returns_to_baseline_in_every_process_after_both_let_go(spawned):
    settle()
    torch.openreg.empty_cache()
    allocated, used = torch.openreg.memory_allocated(0), runtime_used(0)
    x = torch.full((1 << 20,), 2.0, device="openreg")
    inbox, results, control = spawned.queue(), spawned.queue(), spawned.queue()
    spawned.start(ipc_workers.holder, inbox, results, control)
    inbox.put(x)
    held = result(results)
    assert held["values"][:3] == [2.0] * 3
    assert held["used_holding"] >= held["used_before"] + (4 << 20)  # mapped in its device heap

    del x
    settle()
    # The receiver still holds it: this process keeps it allocated.
    assert torch.openreg.memory_allocated(0) >= allocated + (4 << 20)

    control.put("let go")
    assert result(results)["used_after"] == held["used_before"]
    settle()
    assert torch.openreg.memory_allocated(0) == allocated
    torch.openreg.empty_cache()
    assert runtime_used(0) == used


def test_memory_stays_allocated_until_ipc_collect_finds_it_released(spawned):
    settle()
    allocated = torch.openreg.memory_allocated(0)
    inbox, results, control = spawned.queue(), spawned.queue(), spawned.queue()
    spawned.start(ipc_workers.holder, inbox, results, control)
    inbox.put(torch.ones(1 << 18, device="openreg"))
    result(results)
    control.put("let go")
    result(results)
    gc.collect()
    assert torch.openreg.memory_allocated(0) > allocated  # sent, released, not yet collected
    torch.openreg.ipc_collect()
    assert torch.openreg.memory_allocated(0) == allocated


def test_data_outlives_a_producer_that_exits_first(children):
    outbox, results, control = children.queue(), children.queue(), children.queue()
    producer = children.start(ipc_workers.early_producer, outbox, results, control)
    x = outbox.get(timeout=TIMEOUT)
    total = result(results)
    control.put("received")
    producer.join(TIMEOUT)
    assert producer.exitcode == 0
    # The producer's memory is gone from its process; this one's mapping keeps it.
    churn = [torch.randn(1 << 16, device="openreg") for _ in range(8)]
    del churn
    torch.openreg.empty_cache()
    expected = torch.arange(1 << 16, dtype=torch.float32) * 3
    assert torch.equal(x.cpu(), expected)
    assert float(x.sum().item()) == total
    x.add_(1)  # still writable
    assert torch.equal(x.cpu(), expected + 1)
    del x
    settle()


# --- fork ------------------------------------------------------------------------------

# The kernel view is a shared mapping of a memory file: a forked child must get
# memory of its own (MADV_DONTFORK and a new file, RuntimeMemory.cpp), or its
# allocations would land on the parent's bytes and its frees punch holes in them.
FORK_BEFORE_INIT_SHARES_NOTHING = textwrap.dedent(
    """
    import json, os, torch, torch_openreg
    assert not torch.openreg.is_initialized()
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(to_child_r, 1)                      # the parent has written its tensor
        y = torch.full((1 << 16,), 7.0, device="openreg")
        y.add_(1)
        torch.openreg.synchronize()
        ok = y.cpu().eq(8).all().item()
        del y
        torch.openreg.empty_cache()                 # frees (punches) the child's pages
        os.write(to_parent_w, b"1" if ok else b"0")
        os._exit(0)
    x = torch.full((1 << 16,), 1.0, device="openreg")
    torch.openreg.synchronize()
    os.write(to_child_w, b"1")
    child_ok = os.read(to_parent_r, 1) == b"1"
    os.waitpid(pid, 0)
    print("RESULT " + json.dumps({"child_ok": child_ok, "parent_ok": x.cpu().eq(1).all().item()}))
    """
)


def test_child_forked_before_initialisation_has_device_memory_of_its_own():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-c", FORK_BEFORE_INIT_SHARES_NOTHING], cwd=repo, capture_output=True, text=True,
        timeout=TIMEOUT,
    )
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert json.loads(results[-1][len("RESULT ") :]) == {"child_ok": True, "parent_ok": True}


# --- what cannot be shared ---------------------------------------------------------------


def test_non_leaf_that_requires_grad_is_refused_by_the_sender_at_once(spawned):
    y = torch.ones(3, device="openreg", requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="non-leaf tensor which requires_grad"):
        ForkingPickler.dumps(y)
    parent_end, _child_end = spawned.ctx.Pipe()
    with pytest.raises(RuntimeError, match="non-leaf tensor which requires_grad"):
        parent_end.send(y)


def test_storage_a_receiver_cannot_place_fails_there_with_a_clear_error(spawned, monkeypatch):
    monkeypatch.setenv("OPENREG_DEVICE_COUNT", "1")
    inbox, results = spawned.queue(), spawned.queue()
    spawned.start(ipc_workers.describe, inbox, results)
    monkeypatch.undo()
    inbox.put(torch.ones(4, device="openreg:1"))
    status, message = results.get(timeout=TIMEOUT)
    assert status == "error"
    assert "openreg:1" in message and "fewer openreg devices" in message


def test_message_whose_producer_is_gone_fails_instead_of_waiting(spawned):
    """The descriptors travel through the sender's resource sharer (as torch's CPU
    tensors with the file_descriptor strategy): a receiver that unpickles after the
    sender exited gets an error, not a hang."""
    outbox, results = spawned.queue(), spawned.queue()
    producer = spawned.start(ipc_workers.early_producer, outbox, results)
    result(results)
    producer.join(TIMEOUT)
    assert producer.exitcode == 0
    start = time.monotonic()
    with pytest.raises(OSError):
        outbox.get(timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT


# --- DataLoader ------------------------------------------------------------------------


def test_dataloader_spawn_workers_return_openreg_tensors():
    loader = torch.utils.data.DataLoader(
        ipc_workers.OpenRegSquares(20),
        batch_size=4,
        num_workers=2,
        multiprocessing_context="spawn",
        timeout=TIMEOUT,
    )
    batches = list(loader)
    assert len(batches) == 5
    for i, (index, square) in enumerate(batches):
        assert square.device == torch.device("openreg:0")
        expected = torch.arange(4 * i, 4 * i + 4, dtype=torch.float32)
        assert torch.equal(index.cpu(), expected.long())
        assert torch.equal(square.cpu(), (expected**2).unsqueeze(1).expand(4, 3))
    del batches, loader
    settle()
