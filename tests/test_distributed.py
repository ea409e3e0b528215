"""torch.distributed on openreg tensors: the openreg_gloo backend (torch's gloo reading and
writing device memory through CPU aliases) and DistributedDataParallel against one process
on the whole batch (the examples under torchrun: tests/test_distributed_examples.py).

The checks marked @on_every_rank run in two processes that this module launches once,
on loopback (a FileStore in a temporary directory, gloo's TCP on 127.0.0.1): each
process runs every check in order and records "ok" or the error, and
test_on_two_ranks[<check>] asserts that the check passed on both ranks. Every launch
has a hard timeout after which its processes are killed, and
test_launches_leave_no_process_behind asserts that none outlives it. Children write
what they report to files, never to stdout, which the dispatch trace may fill.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as dist

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent
WORLD = 2
LAUNCH_TIMEOUT = 120  # seconds for a whole launch; it normally takes 10-20
PG_TIMEOUT = datetime.timedelta(seconds=30)  # a collective a peer never joins fails after this

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds leftover processes in /proc"),
    # One pytest-xdist worker runs the module: the two-rank launch is a module fixture.
    pytest.mark.xdist_group("distributed"),
]


# --- what runs in each of the two processes -------------------------------------------------


@dataclass
class Rank:
    rank: int
    world: int
    device: torch.device
    directory: Path
    _groups: int = 0

    def init_method(self) -> str:
        """A fresh rendezvous file; every rank asks in the same order, so they agree."""
        self._groups += 1
        return f"file://{self.directory / f'store{self._groups}'}"

    def init(self, backend: str | None = None, **kwargs) -> None:
        dist.init_process_group(
            backend, init_method=self.init_method(), rank=self.rank, world_size=self.world,
            timeout=PG_TIMEOUT, **kwargs,
        )


CHECKS: dict[str, Callable[[Rank], None]] = {}  # in group with the default group set up
INIT_CHECKS: dict[str, Callable[[Rank], None]] = {}  # set up (and destroy) their own group


def on_every_rank(check):
    CHECKS[check.__name__] = check
    return check


def on_every_rank_with_its_own_group(check):
    INIT_CHECKS[check.__name__] = check
    return check


def per_rank(r: Rank, *shape, dtype=torch.float32) -> torch.Tensor:
    """Values that differ by rank: rank r holds (r + 1) * [1, 2, 3, ...]."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n, dtype=torch.float64) + 1) * (r.rank + 1)).reshape(shape).to(dtype)


def every_ranks(*shape, dtype=torch.float32) -> list[torch.Tensor]:
    """What per_rank gives on each rank, on the CPU: the oracle."""
    return [per_rank(Rank(i, WORLD, torch.device("cpu"), Path()), *shape, dtype=dtype) for i in range(WORLD)]


def assert_same(actual: torch.Tensor, expected: torch.Tensor, device: torch.device) -> None:
    assert actual.device == device, f"result on {actual.device}, expected on {device}"
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


@on_every_rank
def default_group_is_openreg_gloo(r: Rank):
    from torch_openreg.openreg.distributed import ProcessGroupOpenRegGloo

    assert type(dist.group.WORLD) is ProcessGroupOpenRegGloo
    assert dist.group.WORLD.name() == "openreg_gloo"
    assert dist.get_default_backend_for_device("openreg") == "openreg_gloo"


@on_every_rank
def all_reduce_sums_in_place_on_the_device(r: Rank):
    t = per_rank(r, 5).to(r.device)
    storage = t.untyped_storage().data_ptr()
    dist.all_reduce(t)
    assert t.untyped_storage().data_ptr() == storage
    assert_same(t, sum(every_ranks(5)), r.device)


@on_every_rank
def all_reduce_supports_every_reduce_op(r: Rank):
    ops = {
        dist.ReduceOp.SUM: lambda a, b: a + b,
        dist.ReduceOp.AVG: lambda a, b: (a + b) / 2,
        dist.ReduceOp.PRODUCT: lambda a, b: a * b,
        dist.ReduceOp.MIN: torch.minimum,
        dist.ReduceOp.MAX: torch.maximum,
    }
    for op, combine in ops.items():
        t = per_rank(r, 4).to(r.device)
        dist.all_reduce(t, op=op)
        assert_same(t, combine(*every_ranks(4)), r.device)
    bitwise = {dist.ReduceOp.BAND: torch.bitwise_and, dist.ReduceOp.BOR: torch.bitwise_or,
               dist.ReduceOp.BXOR: torch.bitwise_xor}
    for op, combine in bitwise.items():
        t = per_rank(r, 4, dtype=torch.int32).to(r.device)
        dist.all_reduce(t, op=op)
        assert_same(t, combine(*every_ranks(4, dtype=torch.int32)), r.device)


@on_every_rank
def all_reduce_keeps_the_dtype(r: Rank):
    for dtype in (torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8):
        t = per_rank(r, 3, dtype=dtype).to(r.device)
        dist.all_reduce(t)
        assert t.dtype == dtype
        assert_same(t, sum(every_ranks(3, dtype=dtype)), r.device)


@on_every_rank
def broadcast_copies_the_source_ranks_tensor(r: Rank):
    for src in range(WORLD):
        t = per_rank(r, 2, 3).to(r.device)
        dist.broadcast(t, src=src)
        assert_same(t, every_ranks(2, 3)[src], r.device)


@on_every_rank
def all_gather_fills_one_tensor_per_rank(r: Rank):
    out = [torch.zeros(4, device=r.device) for _ in range(WORLD)]
    dist.all_gather(out, per_rank(r, 4).to(r.device))
    for got, expected in zip(out, every_ranks(4)):
        assert_same(got, expected, r.device)


@on_every_rank
def all_gather_into_tensor_concatenates_the_ranks(r: Rank):
    out = torch.zeros(WORLD * 4, device=r.device)
    dist.all_gather_into_tensor(out, per_rank(r, 4).to(r.device))
    assert_same(out, torch.cat(every_ranks(4)), r.device)


@on_every_rank
def reduce_scatter_gives_each_rank_its_reduced_chunk(r: Rank):
    out = torch.zeros(3, device=r.device)
    dist.reduce_scatter(out, list(per_rank(r, WORLD * 3).to(r.device).chunk(WORLD)))
    assert_same(out, sum(every_ranks(WORLD * 3)).chunk(WORLD)[r.rank], r.device)


@on_every_rank
def reduce_scatter_tensor_gives_each_rank_its_reduced_chunk(r: Rank):
    out = torch.zeros(3, device=r.device)
    dist.reduce_scatter_tensor(out, per_rank(r, WORLD * 3).to(r.device))
    assert_same(out, sum(every_ranks(WORLD * 3)).chunk(WORLD)[r.rank], r.device)


@on_every_rank
def reduce_gather_scatter_and_all_to_all_work_too(r: Rank):
    t = per_rank(r, 4).to(r.device)
    dist.reduce(t, dst=0)
    if r.rank == 0:
        assert_same(t, sum(every_ranks(4)), r.device)
    gathered = [torch.zeros(4, device=r.device) for _ in range(WORLD)] if r.rank == 1 else None
    dist.gather(per_rank(r, 4).to(r.device), gathered, dst=1)
    if r.rank == 1:
        for got, expected in zip(gathered, every_ranks(4)):
            assert_same(got, expected, r.device)
    out = torch.zeros(2, device=r.device)
    dist.scatter(out, list(per_rank(r, 2 * WORLD).to(r.device).chunk(WORLD)) if r.rank == 0 else None, src=0)
    assert_same(out, every_ranks(2 * WORLD)[0].chunk(WORLD)[r.rank], r.device)
    out = torch.zeros(2 * WORLD, device=r.device)
    dist.all_to_all_single(out, per_rank(r, 2 * WORLD).to(r.device))
    assert_same(out, torch.cat([t.chunk(WORLD)[r.rank] for t in every_ranks(2 * WORLD)]), r.device)


@on_every_rank
def barrier_returns_only_once_every_rank_has_arrived(r: Rank):
    store = dist.distributed_c10d._get_default_store()
    if r.rank == 1:
        time.sleep(0.3)
        store.set("rank 1 reached the barrier", "yes")
    dist.barrier()
    assert store.check(["rank 1 reached the barrier"])


@on_every_rank
def send_and_recv_move_a_tensor_between_ranks(r: Rank):
    peer = 1 - r.rank
    for sender in range(WORLD):
        t = per_rank(r, 6).to(r.device)
        if r.rank == sender:
            dist.send(t, dst=peer)
        else:
            dist.recv(t, src=peer)
        assert_same(t, every_ranks(6)[sender], r.device)
    out = torch.zeros(6, device=r.device)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, per_rank(r, 6).to(r.device), peer),
        dist.P2POp(dist.irecv, out, peer),
    ])
    for work in works:
        work.wait()
    assert_same(out, every_ranks(6)[peer], r.device)


def strided_column_case(r: Rank, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A 4x4 tensor per rank and its column 1: a view gloo alone would get wrong."""
    base = per_rank(r, 4, 4).to(device)
    return base, base[:, 1]


@on_every_rank
def non_contiguous_tensors_are_written_through_their_strides(r: Rank):
    for device in (r.device, torch.device("cpu")):  # the CPU tensors of this group too
        base = per_rank(r, 3, 4).to(device)
        dist.all_reduce(base.t())  # transposed: dense, but not contiguous
        assert_same(base, sum(every_ranks(3, 4)), device)

        base, column = strided_column_case(r, device)
        dist.broadcast(column, src=1)
        expected = every_ranks(4, 4)[r.rank].clone()
        expected[:, 1] = every_ranks(4, 4)[1][:, 1]
        assert_same(base, expected, device)  # the other columns are untouched

        base, column = strided_column_case(r, device)
        dist.all_reduce(column)
        expected = every_ranks(4, 4)[r.rank].clone()
        expected[:, 1] = sum(every_ranks(4, 4))[:, 1]
        assert_same(base, expected, device)

        out = torch.zeros(4, WORLD, device=device)
        dist.all_gather([out[:, i] for i in range(WORLD)], strided_column_case(r, device)[1])
        assert_same(out, torch.stack([t[:, 1] for t in every_ranks(4, 4)], dim=1), device)

        base, column = strided_column_case(r, device)
        if r.rank == 0:
            dist.send(column, dst=1)
        else:
            dist.recv(column, src=0)
        expected = every_ranks(4, 4)[r.rank].clone()
        expected[:, 1] = every_ranks(4, 4)[0][:, 1]
        assert_same(base, expected, device)


@on_every_rank
def async_work_results_are_visible_to_kernels_after_wait(r: Rank):
    t = per_rank(r, 1000).to(r.device)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert_same(t * 2, 2 * sum(every_ranks(1000)), r.device)
    (value,) = work.get_future().value()  # the openreg tensor itself, as DDP needs
    assert value.device == r.device and value.data_ptr() == t.data_ptr()


@on_every_rank
def async_collective_returns_before_its_peer_joins_and_overlaps_compute(r: Rank):
    # Rank 1 enters the all_reduce only once rank 0 says, through the store, that
    # its own async call has returned and its compute has run: a call that waited
    # for its peers would leave rank 1 waiting on the store until the timeout.
    store = dist.distributed_c10d._get_default_store()
    t = per_rank(r, 1000).to(r.device)
    if r.rank == 0:
        work = dist.all_reduce(t, async_op=True)
        computed = (torch.ones(256, 256, device=r.device) @ torch.ones(256, 256, device=r.device)).sum().item()
        store.set("rank 0 computed during its all_reduce", str(computed))
        work.wait()
    else:
        store.wait(["rank 0 computed during its all_reduce"], datetime.timedelta(seconds=60))
        dist.all_reduce(t)
    assert store.get("rank 0 computed during its all_reduce") == str(256.0**3).encode()
    assert_same(t, sum(every_ranks(1000)), r.device)


@on_every_rank
def collectives_wait_for_work_queued_on_the_current_stream(r: Rank):
    # The copy runs on the stream's worker after 200 ms; gloo must read its result.
    src = per_rank(r, 64).to(r.device)
    t = torch.zeros(64, device=r.device)
    torch.openreg._sleep(200)
    t.copy_(src, non_blocking=True)
    dist.all_reduce(t)
    assert_same(t, sum(every_ranks(64)), r.device)


@on_every_rank
def cpu_tensors_work_on_the_same_group(r: Rank):
    t = per_rank(r, 3)
    dist.all_reduce(t)
    assert_same(t, sum(every_ranks(3)), torch.device("cpu"))
    objects = [None] * WORLD
    dist.all_gather_object(objects, {"rank": r.rank})
    assert objects == [{"rank": i} for i in range(WORLD)]


@on_every_rank
def mixing_openreg_and_cpu_tensors_in_one_call_is_refused(r: Rank):
    out = [torch.zeros(2) for _ in range(WORLD)]
    try:
        dist.all_gather(out, torch.ones(2, device=r.device))
    except ValueError as e:
        assert "all tensors of one call must be on one device, got tensors on cpu, openreg:" in str(e)
    else:
        raise AssertionError("all_gather into CPU tensors from an openreg tensor did not raise")


@on_every_rank
def wrong_output_sizes_raise_naming_the_collective(r: Rank):
    # Checked by gloo on each rank before anything is sent: every rank raises.
    cases = {
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.zeros(WORLD * 4 - 1, device=r.device), torch.ones(4, device=r.device)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.zeros(3, device=r.device), torch.ones(WORLD * 4, device=r.device)),
    }
    for name, call in cases.items():
        try:
            call()
        except RuntimeError as e:
            assert str(e).startswith(f"openreg_gloo {name}: "), str(e)
            assert "size" in str(e).lower() or "shape" in str(e).lower(), str(e)
        else:
            raise AssertionError(f"{name} with a wrong output size did not raise")
    t = per_rank(r, 3).to(r.device)  # the group still works
    dist.all_reduce(t)
    assert_same(t, sum(every_ranks(3)), r.device)


@on_every_rank
def new_groups_use_openreg_gloo_too(r: Rank):
    group = dist.new_group(list(range(WORLD)))
    t = per_rank(r, 2).to(r.device)
    dist.all_reduce(t, group=group)
    assert_same(t, sum(every_ranks(2)), r.device)
    dist.destroy_process_group(group)


# --- DTensor, FSDP2, distributed checkpoints: torch's C++ functional collectives ---------


def mesh_of(r: Rank):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("openreg", (r.world,))


def chunk(t: torch.Tensor, r: Rank, dim: int = 0) -> torch.Tensor:
    return t.chunk(r.world, dim)[r.rank]


@on_every_rank
def functional_collectives_gather_and_reduce_scatter_on_the_device(r: Rank):
    # torch.ops._c10d_functional (DTensor's collectives) run in C++ and reach the group
    # through ProcessGroup::all_gather_single_coalesced / reduce_scatter_single_coalesced.
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    t = per_rank(r, 4).to(r.device)
    whole = torch.cat(every_ranks(4))
    total = sum(every_ranks(4))
    assert_same(funcol.all_gather_tensor(t, 0, group), whole, r.device)
    gathered = funcol.all_gather_into_tensor_coalesced([t, t * 2], group)
    assert_same(gathered[0], whole, r.device)
    assert_same(gathered[1], whole * 2, r.device)
    assert_same(funcol.reduce_scatter_tensor(t, "sum", 0, group), chunk(total, r), r.device)
    scattered = funcol.reduce_scatter_tensor_coalesced([t, t * 2], "sum", [0, 0], group)
    assert_same(scattered[0], chunk(total, r), r.device)
    assert_same(scattered[1], chunk(total * 2, r), r.device)


@on_every_rank
def dtensor_shards_gathers_and_redistributes_as_the_whole_tensor(r: Rank):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = mesh_of(r)
    whole = torch.arange(32.0).reshape(8, 4)
    d = distribute_tensor(whole, mesh, [Shard(0)])
    assert_same(d.to_local(), chunk(whole, r), r.device)
    assert_same(d.full_tensor(), whole, r.device)
    assert_same(d.redistribute(mesh, [Replicate()]).to_local(), whole, r.device)
    assert_same(d.redistribute(mesh, [Shard(1)]).to_local(), chunk(whole, r, 1), r.device)
    partial = DTensor.from_local(per_rank(r, 4).to(r.device), mesh, [Partial()])
    total = sum(every_ranks(4))
    assert_same(partial.redistribute(mesh, [Shard(0)]).to_local(), chunk(total, r), r.device)
    assert_same(partial.full_tensor(), total, r.device)
    # Operators and autograd on DTensors: sum(a @ b) with a sharded by rows.
    a = distribute_tensor(whole, mesh, [Shard(0)]).requires_grad_()
    b = distribute_tensor(torch.ones(4, 3), mesh, [Replicate()])
    y = (a @ b).sum()
    assert_same(y.full_tensor(), (whole @ torch.ones(4, 3)).sum(), r.device)
    y.backward()
    assert_same(a.grad.full_tensor(), torch.full((8, 4), 3.0), r.device)


# DTensor's random operators: torch's OffsetBasedRNGTracker reads the openreg generator's
# (seed, offset) state and gives the shard of linear index k the stream from offset
# k * (the first shard's numel, rounded up to 4); the offset counts pairs of CPU draws,
# the most any elementwise distribution takes per element (docs/integration/generator.md).
def dtensor_random_ops():
    import torch.distributed.tensor as dt

    return {
        "nn.init.uniform_": (lambda d: torch.nn.init.uniform_(d), torch.float32),
        "nn.init.uniform_ float64": (lambda d: torch.nn.init.uniform_(d), torch.float64),
        "nn.init.normal_": (lambda d: torch.nn.init.normal_(d), torch.float32),
        "dropout": (lambda d: torch.nn.functional.dropout(d.fill_(1.0), 0.5), torch.float32),
        "rand": (lambda d: dt.rand(d.shape, device_mesh=d.device_mesh, placements=d.placements), torch.float32),
    }


def local_draw_on_cpu(op, shape, dtype, seed: int, pairs_before: int) -> torch.Tensor:
    """What `op` draws on the CPU for a tensor of `shape`, `pairs_before` draw pairs after `seed`."""
    torch.manual_seed(seed)
    torch.empty(2 * pairs_before).uniform_()  # one CPU draw per float32
    if op is None:
        return torch.empty(shape, dtype=dtype).uniform_()
    return op(torch.empty(shape, dtype=dtype))


def dtensor_random(r: Rank, name: str, placements, seed: int | None = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """`name` on an (8, 8) DTensor placed so, after torch.manual_seed(seed): (local, full)."""
    from torch.distributed.tensor import distribute_tensor

    op, dtype = dtensor_random_ops()[name]
    d = distribute_tensor(torch.empty(8, 8, dtype=dtype, device=r.device), mesh_of(r), placements)
    if seed is not None:
        torch.manual_seed(seed)
    out = op(d)
    return out.to_local(), out.full_tensor()


def gathered(t: torch.Tensor) -> list[torch.Tensor]:
    every = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(every, t)
    return [e.cpu() for e in every]


@on_every_rank
def dtensor_random_ops_draw_each_shard_from_its_offset_of_the_seeds_stream(r: Rank):
    from torch.distributed.tensor import Replicate, Shard

    for name, (op, dtype) in dtensor_random_ops().items():
        cpu_op = None if name == "rand" else op
        for placements, dim in (([Shard(0)], 0), ([Shard(1)], 1), ([Replicate()], None)):
            local, full = dtensor_random(r, name, placements)
            shape = (8, 8) if dim is None else tuple(4 if i == dim else 8 for i in range(2))
            shard = 0 if dim is None else r.rank
            expected = local_draw_on_cpu(cpu_op, shape, dtype, 5, shard * 32)
            torch.testing.assert_close(local.cpu(), expected, rtol=0, atol=0, msg=f"{name} {placements}")
            every = gathered(full)
            assert all(torch.equal(e, every[0]) for e in every), f"{name} {placements}: ranks disagree"
            if dim is not None:
                shards = gathered(local)
                assert not torch.equal(shards[0], shards[1]), f"{name} {placements}: shards drew the same numbers"


@on_every_rank
def dtensor_random_whole_tensor_does_not_depend_on_row_sharding_for_two_draw_operators(r: Rank):
    # dropout (bernoulli_) and float64's uniform_ take two draws per element, as many as
    # an offset step, so row shards continue each other's stream: Shard(0)'s whole
    # tensor is Replicate()'s, which is CPU's for the seed.
    from torch.distributed.tensor import Replicate, Shard

    for name in ("dropout", "nn.init.uniform_ float64"):
        op, dtype = dtensor_random_ops()[name]
        _, by_rows = dtensor_random(r, name, [Shard(0)])
        _, replicated = dtensor_random(r, name, [Replicate()])
        torch.testing.assert_close(by_rows.cpu(), replicated.cpu(), rtol=0, atol=0)
        torch.testing.assert_close(replicated.cpu(), local_draw_on_cpu(op, (8, 8), dtype, 5, 0), rtol=0, atol=0)


@on_every_rank
def dtensor_random_ops_leave_every_rank_at_the_same_offset_and_reproduce(r: Rank):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._random import manual_seed

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        manual_seed(11, mesh_of(r))  # DTensor's own seeding: torch.manual_seed on every rank
        _, full = dtensor_random(r, "nn.init.uniform_", [Shard(0)], seed=None)
        state = torch.openreg.get_rng_state()
        after = torch.rand(4, device=r.device)  # a plain draw continues from there
        return full, state, after

    full, state, after = run()
    seed, offset = state[:8].view(torch.int64).item(), state[8:].view(torch.int64).item()
    assert (seed, offset) == (11, 64), (seed, offset)  # moved by the whole tensor's numel
    assert all(torch.equal(s, state) for s in gathered(state.to(r.device)))
    assert all(torch.equal(a, after.cpu()) for a in gathered(after))
    torch.testing.assert_close(after.cpu(), local_draw_on_cpu(None, (4,), torch.float32, 11, 64), rtol=0, atol=0)
    again = run()
    torch.testing.assert_close(again[0].cpu(), full.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(again[2].cpu(), after.cpu(), rtol=0, atol=0)


@on_every_rank
def dtensor_random_op_from_a_state_without_an_offset_raises_without_drawing(r: Rank):
    # A cached normal sample (CPU's normal_ of an odd number below 16) has no (seed, offset)
    # form: the state is the CPU generator's, which torch's _PhiloxState refuses.
    from torch.distributed.tensor import Shard, distribute_tensor

    d = distribute_tensor(torch.zeros(8, 8, device=r.device), mesh_of(r), [Shard(0)])
    torch.manual_seed(5)
    torch.randn(3, device=r.device)
    state = torch.openreg.get_rng_state()
    assert state.numel() != 16
    with pytest.raises(AssertionError):
        torch.nn.init.uniform_(d)
    assert torch.equal(d.to_local().cpu(), torch.zeros(4, 8))
    assert torch.equal(torch.openreg.get_rng_state(), state)
    torch.manual_seed(5)  # back to a (seed, offset): DTensor's random operators work again
    torch.nn.init.uniform_(d)
    torch.testing.assert_close(d.to_local().cpu(), local_draw_on_cpu(None, (4, 8), torch.float32, 5, 32 * r.rank),
                               rtol=0, atol=0)


def fully_sharded_mlp(r: Rank, **fully_shard_kwargs):
    """A small MLP on the device, fully_shard-ed layer by layer over the ranks, and the
    same MLP on the CPU (the oracle)."""
    import copy

    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    model.to(r.device)
    mesh = mesh_of(r)
    for module in (model[0], model[2], model):
        fully_shard(module, mesh=mesh, **fully_shard_kwargs)
    return model, reference


@on_every_rank
def fsdp2_training_steps_match_one_process_on_the_whole_batch(r: Rank):
    model, reference = fully_sharded_mlp(r)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=0.01)
    batches = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(4 * r.world, 8, generator=batches)
        model(chunk(x, r).to(r.device)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        reference(x).square().mean().backward()  # the mean of the ranks' gradients
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    for param, expected in zip(model.parameters(), reference.parameters()):
        full = param.full_tensor()
        assert full.device == r.device
        torch.testing.assert_close(full.cpu(), expected.detach(), rtol=1e-5, atol=1e-6)


@on_every_rank
def distributed_checkpoint_saves_and_loads_sharded_tensors(r: Rank):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = mesh_of(r)
    whole = torch.arange(16.0).reshape(4, 4)
    path = str(r.directory / "checkpoint")
    dcp.save({"w": distribute_tensor(whole, mesh, [Shard(0)]), "step": 3}, checkpoint_id=path)
    target = {"w": distribute_tensor(torch.zeros(4, 4), mesh, [Shard(1)]), "step": 0}
    dcp.load(target, checkpoint_id=path)  # resharded: saved by rows, loaded by columns
    assert target["step"] == 3
    assert_same(target["w"].to_local(), chunk(whole, r, 1), r.device)


@on_every_rank
def fsdp2_with_mixed_precision_matches_one_process_in_bfloat16(r: Rank):
    # MixedPrecisionPolicy: bfloat16 parameters in forward/backward, float32 reduction.
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model, reference = fully_sharded_mlp(r, mp_policy=policy)
    x = torch.randn(4 * r.world, 8, generator=torch.Generator().manual_seed(2))
    out = model(chunk(x, r).to(r.device))
    assert out.dtype == torch.bfloat16
    out.float().square().mean().backward()
    reference.to(torch.bfloat16)(x.bfloat16()).float().square().mean().backward()
    for param, expected in zip(model.parameters(), reference.parameters()):
        grad = param.grad.full_tensor()
        assert grad.dtype == torch.float32 and grad.device == r.device
        torch.testing.assert_close(grad.cpu(), expected.grad.float(), rtol=2e-2, atol=2e-2)


@on_every_rank
def tensor_parallel_block_matches_one_process(r: Rank):
    # parallelize_module: the first linear split by columns, the second by rows.
    import copy

    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    reference = copy.deepcopy(block)
    block.to(r.device)
    parallelize_module(block, mesh_of(r), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    out = block(x.to(r.device))
    expected = reference(x)
    torch.testing.assert_close(out.cpu(), expected.detach(), rtol=1e-5, atol=1e-6)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(block[0].weight.grad.full_tensor().cpu(), reference[0].weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(block[2].weight.grad.full_tensor().cpu(), reference[2].weight.grad, rtol=1e-5, atol=1e-6)


@on_every_rank
def sequence_parallel_block_matches_one_process(r: Rank):
    # A transformer block's sequence parallelism: the LayerNorm on the rank's
    # share of the sequence (SequenceParallel), all-gathered into the column-split
    # linear, the row-split one reduce-scattered back onto the sequence shards.
    import copy

    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module)

    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.LayerNorm(8), torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    reference = copy.deepcopy(block)
    block.to(r.device)
    parallelize_module(block, mesh_of(r), {
        "0": SequenceParallel(),
        "1": ColwiseParallel(input_layouts=Shard(1)),
        "3": RowwiseParallel(output_layouts=Shard(1)),
    })
    x = torch.randn(2, 4 * r.world, 8, generator=torch.Generator().manual_seed(3))
    mine = slice(4 * r.rank, 4 * (r.rank + 1))
    out = block(x[:, mine].to(r.device))
    expected = reference(x)
    torch.testing.assert_close(out.cpu(), expected[:, mine].detach(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    # Each rank's loss is the sum over its share of the sequence: the ranks'
    # gradients together are the gradient of the whole sequence's sum.
    expected.sum().backward()
    for i in (0, 1, 3):
        torch.testing.assert_close(
            block[i].weight.grad.full_tensor().cpu(), reference[i].weight.grad, rtol=1e-5, atol=1e-5)


@on_every_rank
def fsdp_times_tp_on_two_dimensional_meshes_matches_one_process(r: Rank):
    # init_device_mesh("openreg", (dp, tp)): the MLP's linears split over "tp" (columns,
    # then rows) and fully_shard-ed over "dp", each dp rank on its share of the batch.
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for shape in ((2, 1), (1, 2)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        reference = copy.deepcopy(model)
        mesh = init_device_mesh("openreg", shape, mesh_dim_names=("dp", "tp"))
        model.to(r.device)
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
        batches = torch.Generator().manual_seed(4)
        dp, dp_rank = shape[0], mesh["dp"].get_local_rank()
        for _ in range(2):
            x = torch.randn(4 * dp, 8, generator=batches)
            model(x.chunk(dp)[dp_rank].to(r.device)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            reference(x).square().mean().backward()
            reference_optimizer.step()
            reference_optimizer.zero_grad()
        for param, expected in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(param.full_tensor().cpu(), expected.detach(), rtol=1e-5, atol=1e-6,
                                       msg=f"mesh {shape}")


@on_every_rank
def all_to_all_single_with_uneven_splits_and_batch_isend_irecv(r: Rank):
    # Rank 0 sends 1 element to rank 0 and 3 to rank 1; rank 1 sends 2 and 2.
    sends = [[1, 3], [2, 2]]
    t = per_rank(r, 4).to(r.device)
    received = [sends[src][r.rank] for src in range(r.world)]
    out = torch.empty(sum(received), device=r.device)
    dist.all_to_all_single(out, t, output_split_sizes=received, input_split_sizes=sends[r.rank])
    expected = torch.cat([every_ranks(4)[src].split(sends[src])[r.rank] for src in range(r.world)])
    assert_same(out, expected, r.device)
    peer = 1 - r.rank
    inbox = torch.empty(3, device=r.device)
    ops = [dist.P2POp(dist.isend, per_rank(r, 3).to(r.device), peer), dist.P2POp(dist.irecv, inbox, peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert_same(inbox, every_ranks(3)[peer], r.device)


@on_every_rank
def compiled_functional_collectives_match_eager(r: Rank):
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD

    def step(t):
        reduced = funcol.all_reduce(t * 2, "sum", group)
        gathered = funcol.all_gather_tensor(reduced + 1, 0, group)
        return gathered.sum(0)

    t = per_rank(r, 4).to(r.device)
    compiled = torch.compile(step, backend="inductor", fullgraph=True)  # the collectives in the graph
    assert_same(compiled(t), step(t).cpu(), r.device)


# --- C++ callers: the group's openreg backend in C++ ---------------------------------------
# What C++ calls through a ProcessGroup method the trampoline does not forward to Python
# runs c10d's dispatcher op, whose PrivateUse1 kernel asks ProcessGroup::getBackend for
# openreg's backend: csrc/distributed/OpenRegProcessGroupBackend.cpp, which calls the group's
# Python methods. c10d.ProcessGroup.<method>(group, ...) calls the C++ method as C++ code
# does (torch's binding of the base class, not the group's Python override).


@on_every_rank
def all_gather_into_tensor_out_writes_the_output_on_the_device(r: Rank):
    # Inductor's FSDP2 passes emit this op; it calls ProcessGroup::_allgather_base in C++.
    group = dist.group.WORLD
    out = torch.full((WORLD * 4,), -1.0, device=r.device)
    storage = out.untyped_storage().data_ptr()
    result = torch.ops._c10d_functional.all_gather_into_tensor_out(
        per_rank(r, 4).to(r.device), WORLD, group.group_name, out=out)
    torch.ops._c10d_functional.wait_tensor(result)
    assert out.untyped_storage().data_ptr() == storage
    assert_same(out, torch.cat(every_ranks(4)), r.device)


@on_every_rank
def inductors_bucketed_all_gathers_match_eager(r: Rank):
    # Inductor's all-gather bucketing (the FSDP passes' bucket_all_gathers_fx) gathers two
    # tensors with one all_gather_into_tensor_out into a bucket.
    import torch._inductor.config as inductor_config
    import torch.distributed._functional_collectives as funcol
    from torch._inductor.utils import run_and_get_code

    group = dist.group.WORLD

    def gather_both(a, b):
        return funcol.all_gather_tensor(a * 2, 0, group), funcol.all_gather_tensor(b + 1, 0, group)

    a, b = per_rank(r, 4).to(r.device), per_rank(r, 2, 3).to(r.device)
    with inductor_config.patch(bucket_all_gathers_fx="all"):
        (x, y), code = run_and_get_code(torch.compile(gather_both, backend="inductor", fullgraph=True), a, b)
    assert any("all_gather_into_tensor_out" in c for c in code), "the bucketing pass did not run"
    assert_same(x, torch.cat(every_ranks(4)) * 2, r.device)
    assert_same(y, torch.cat(every_ranks(2, 3)) + 1, r.device)


@on_every_rank
def the_groups_cpp_backend_for_openreg_is_its_own_and_gloo_serves_cpu(r: Rank):
    from torch._C import _distributed_c10d as c10d

    group = dist.group.WORLD
    backend = c10d.ProcessGroup._get_backend(group, r.device)  # ProcessGroup::getBackend
    assert backend.name() == "openreg_gloo"
    assert backend.rank() == r.rank and backend.size() == WORLD
    assert c10d.ProcessGroup._get_backend(group, torch.device("cpu")).name() == "gloo"
    assert group._get_backend(r.device).name() == "openreg_gloo"  # from Python: the same answer


@on_every_rank
def reduce_gather_scatter_and_all_to_all_called_from_cpp_run_on_the_device(r: Rank):
    from torch._C import _distributed_c10d as c10d

    group = dist.group.WORLD
    opts = c10d.ReduceOptions()
    opts.rootRank = 0
    t = per_rank(r, 4).to(r.device)
    c10d.ProcessGroup.reduce(group, [t], opts).wait()
    if r.rank == 0:
        assert_same(t, sum(every_ranks(4)), r.device)
    opts = c10d.GatherOptions()
    opts.rootRank = 1
    gathered = [[torch.zeros(4, device=r.device) for _ in range(WORLD)]] if r.rank == 1 else []
    c10d.ProcessGroup.gather(group, gathered, [per_rank(r, 4).to(r.device)], opts).wait()
    if r.rank == 1:
        for got, expected in zip(gathered[0], every_ranks(4)):
            assert_same(got, expected, r.device)
    opts = c10d.ScatterOptions()
    opts.rootRank = 0
    out = torch.zeros(2, device=r.device)
    pieces = [list(per_rank(r, 2 * WORLD).to(r.device).chunk(WORLD))] if r.rank == 0 else []
    c10d.ProcessGroup.scatter(group, [out], pieces, opts).wait()
    assert_same(out, every_ranks(2 * WORLD)[0].chunk(WORLD)[r.rank], r.device)
    outs = [torch.zeros(2, device=r.device) for _ in range(WORLD)]
    c10d.ProcessGroup.alltoall(group, outs, list(per_rank(r, 2 * WORLD).to(r.device).chunk(WORLD)),
                               c10d.AllToAllOptions()).wait()
    for src, got in enumerate(outs):
        assert_same(got, every_ranks(2 * WORLD)[src].chunk(WORLD)[r.rank], r.device)
    # all_gather_into_tensor, reduce_scatter_tensor and allgather_coalesced, as C++ calls them.
    out = torch.zeros(WORLD * 4, device=r.device)
    c10d.ProcessGroup.all_gather_single(group, out, per_rank(r, 4).to(r.device)).wait()
    assert_same(out, torch.cat(every_ranks(4)), r.device)
    out = torch.zeros(3, device=r.device)
    c10d.ProcessGroup.reduce_scatter_single(group, out, per_rank(r, WORLD * 3).to(r.device)).wait()
    assert_same(out, sum(every_ranks(WORLD * 3)).chunk(WORLD)[r.rank], r.device)
    outs = [[torch.zeros(2, device=r.device)] for _ in range(WORLD)]  # [rank][input]
    c10d.ProcessGroup.allgather_coalesced(group, outs, [per_rank(r, 2).to(r.device)]).wait()
    for got, expected in zip(outs, every_ranks(2)):
        assert_same(got[0], expected, r.device)


@on_every_rank
def the_groups_cpp_backend_serves_every_collective_on_the_device(r: Rank):
    # Each collective of the C++ backend itself (what any C++ holder of
    # getBackend(openreg) calls), against the oracle.
    from torch._C import _distributed_c10d as c10d

    group = dist.group.WORLD
    backend = c10d.ProcessGroup._get_backend(group, r.device)
    d = r.device
    t = per_rank(r, 4).to(d)
    backend.allreduce([t]).wait()
    assert_same(t, sum(every_ranks(4)), d)
    ts = [per_rank(r, 2).to(d), per_rank(r, 3).to(d)]
    backend.allreduce_coalesced(ts).wait()
    assert_same(ts[1], sum(every_ranks(3)), d)
    opts = c10d.BroadcastOptions()
    opts.rootRank = 1
    t = per_rank(r, 4).to(d)
    backend.broadcast([t], opts).wait()
    assert_same(t, every_ranks(4)[1], d)
    opts = c10d.ReduceOptions()
    opts.rootRank = 1
    t = per_rank(r, 4).to(d)
    backend.reduce([t], opts).wait()
    if r.rank == 1:
        assert_same(t, sum(every_ranks(4)), d)
    outs = [[torch.zeros(4, device=d) for _ in range(WORLD)]]
    backend.allgather(outs, [per_rank(r, 4).to(d)]).wait()
    for got, expected in zip(outs[0], every_ranks(4)):
        assert_same(got, expected, d)
    out = torch.zeros(WORLD * 4, device=d)
    backend._allgather_base(out, per_rank(r, 4).to(d)).wait()
    assert_same(out, torch.cat(every_ranks(4)), d)
    outs = [[torch.zeros(2, device=d)] for _ in range(WORLD)]
    backend.allgather_coalesced(outs, [per_rank(r, 2).to(d)]).wait()
    assert_same(outs[1][0], every_ranks(2)[1], d)
    opts = c10d.GatherOptions()
    opts.rootRank = 0
    outs = [[torch.zeros(4, device=d) for _ in range(WORLD)]] if r.rank == 0 else []
    backend.gather(outs, [per_rank(r, 4).to(d)], opts).wait()
    if r.rank == 0:
        assert_same(outs[0][1], every_ranks(4)[1], d)
    opts = c10d.ScatterOptions()
    opts.rootRank = 1
    out = torch.zeros(2, device=d)
    backend.scatter([out], [list(per_rank(r, 2 * WORLD).to(d).chunk(WORLD))] if r.rank == 1 else [], opts).wait()
    assert_same(out, every_ranks(2 * WORLD)[1].chunk(WORLD)[r.rank], d)
    out = torch.zeros(3, device=d)
    backend.reduce_scatter([out], [list(per_rank(r, WORLD * 3).to(d).chunk(WORLD))]).wait()
    assert_same(out, sum(every_ranks(WORLD * 3)).chunk(WORLD)[r.rank], d)
    out = torch.zeros(3, device=d)
    backend._reduce_scatter_base(out, per_rank(r, WORLD * 3).to(d)).wait()
    assert_same(out, sum(every_ranks(WORLD * 3)).chunk(WORLD)[r.rank], d)
    out = torch.zeros(2 * WORLD, device=d)
    backend.alltoall_base(out, per_rank(r, 2 * WORLD).to(d), [], []).wait()
    assert_same(out, torch.cat([x.chunk(WORLD)[r.rank] for x in every_ranks(2 * WORLD)]), d)
    outs = [torch.zeros(2, device=d) for _ in range(WORLD)]
    backend.alltoall(outs, list(per_rank(r, 2 * WORLD).to(d).chunk(WORLD))).wait()
    assert_same(outs[1], every_ranks(2 * WORLD)[1].chunk(WORLD)[r.rank], d)
    peer = 1 - r.rank
    t = per_rank(r, 3).to(d)
    if r.rank == 0:
        backend.send([t], peer, 0).wait()
        backend.recv([t], peer, 1).wait()
    else:
        backend.recv([t], peer, 0).wait()
        backend.send([t], peer, 1).wait()
    assert_same(t, every_ranks(3)[0], d)
    t = per_rank(r, 3).to(d)
    if r.rank == 0:
        backend.send([t], peer, 2).wait()
    else:
        work = backend.recv_anysource([t], 2)
        work.wait()
        assert_same(t, every_ranks(3)[0], d)
        assert work._source_rank() == 0  # Work::sourceRank, from the group's Python work
    backend.barrier().wait()
    # The coalesced tensor forms have no Python binding on Backend: c10d's ops reach them.
    outs = [torch.zeros(WORLD * 2, device=d)]
    work = torch.ops.c10d.allgather_into_tensor_coalesced_(outs, [per_rank(r, 2).to(d)], group.boxed(), False)
    dist.Work.unbox(work).wait()
    assert_same(outs[0], torch.cat(every_ranks(2)), d)


@on_every_rank
def splitting_the_group_raises_naming_new_group(r: Rank):
    # ProcessGroup::splitGroup (C++, and group.split_group) would dereference the store the
    # group was not built with; the group refuses, and keeps working.
    from torch._C import _distributed_c10d as c10d

    group = dist.group.WORLD
    for split in (lambda: c10d.ProcessGroup.split_group(group, list(range(WORLD))),
                  lambda: group.split_group(list(range(WORLD)))):
        try:
            split()
        except RuntimeError as e:
            assert "openreg_gloo cannot split a group" in str(e) and "new_group" in str(e), str(e)
        else:
            raise AssertionError("splitting the openreg group did not raise")
    t = per_rank(r, 3).to(r.device)
    dist.all_reduce(t)
    assert_same(t, sum(every_ranks(3)), r.device)


@on_every_rank
def works_from_the_cpp_backend_wait_give_futures_and_name_errors(r: Rank):
    from torch._C import _distributed_c10d as c10d

    group = dist.group.WORLD
    out = torch.zeros(WORLD * 4, device=r.device)
    work = c10d.ProcessGroup.all_gather_single(group, out, per_rank(r, 4).to(r.device))
    value = work.get_future().wait()
    assert value[0].data_ptr() == out.data_ptr()  # the openreg tensor, not its CPU alias
    work.wait()
    assert work.is_completed()
    assert_same(out, torch.cat(every_ranks(4)), r.device)
    # Gloo's error for a wrong size comes back through C++ with the collective named.
    try:
        c10d.ProcessGroup.all_gather_single(group, torch.zeros(WORLD * 4 - 1, device=r.device),
                                            torch.ones(4, device=r.device))
    except RuntimeError as e:
        assert str(e).startswith("openreg_gloo all_gather_into_tensor: "), str(e)
    else:
        raise AssertionError("all_gather_single with a wrong output size did not raise")
    t = per_rank(r, 3).to(r.device)  # the group still works
    dist.all_reduce(t)
    assert_same(t, sum(every_ranks(3)), r.device)


def train(r: Rank, ddp_kwargs: dict, steps: int = 5) -> list[torch.Tensor]:
    """DDP on openreg, each rank on its half of every batch; returns the final weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    reference = [p.detach().clone() for p in model.parameters()]
    if r.rank == 1:  # DDP starts every rank from rank 0's weights
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = DDP(model.to(r.device), **ddp_kwargs)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.5)
    batches = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=batches), torch.randn(8, 3, generator=batches)
        x, y = x.chunk(WORLD)[r.rank].to(r.device), y.chunk(WORLD)[r.rank].to(r.device)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    weights = [p.detach().cpu() for p in ddp.module.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(weights, reference)), "training changed nothing"
    return weights


@on_every_rank
def ddp_measures_its_times_on_the_device_without_a_warning(r: Rank):
    # DDP's reducer times forward, backward and communication with a timer per device
    # type (c10d::TimerRegistry); openreg registers one (csrc/distributed), so DDP
    # neither warns "Time stats are currently only collected for CPU and CUDA devices"
    # nor leaves the times out of its logging data.
    import warnings

    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(torch.nn.Linear(6, 3).to(r.device))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # the reducer measures the previous iteration at each forward
            ddp(torch.randn(4, 6, device=r.device)).sum().backward()
    assert not [w for w in caught if "Time stats" in str(w.message)], [str(w.message) for w in caught]
    data = ddp._get_ddp_logging_data()
    assert data.get("avg_backward_compute_time", 0) > 0, data
    assert data.get("avg_forward_compute_time", 0) > 0, data


def one_process_on_the_whole_batch(steps: int = 5) -> list[torch.Tensor]:
    """The oracle: the same training on the CPU, one process, full batches, mean loss."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    batches = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=batches), torch.randn(8, 3, generator=batches)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def assert_ddp_matches_one_process(r: Rank, weights: list[torch.Tensor]) -> None:
    everyone = [None] * WORLD
    dist.all_gather_object(everyone, weights)
    for other in everyone:
        for a, b in zip(other, weights):
            assert torch.equal(a, b), "ranks ended with different weights"
    for a, b in zip(weights, one_process_on_the_whole_batch()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@on_every_rank
def ddp_with_device_ids_matches_one_process_on_the_whole_batch(r: Rank):
    assert_ddp_matches_one_process(r, train(r, {"device_ids": [r.rank]}))


@on_every_rank
def ddp_without_device_ids_matches_one_process_on_the_whole_batch(r: Rank):
    assert_ddp_matches_one_process(r, train(r, {}))


@on_every_rank
def ddp_with_gradients_as_bucket_views_matches_one_process(r: Rank):
    assert_ddp_matches_one_process(r, train(r, {"device_ids": [r.rank], "gradient_as_bucket_view": True}))


def assert_group_serves_openreg_and_cpu(r: Rank) -> None:
    for device in (r.device, torch.device("cpu")):
        t = per_rank(r, 3).to(device)
        dist.all_reduce(t)
        assert_same(t, sum(every_ranks(3)), device)


@on_every_rank_with_its_own_group
def init_with_cpu_gloo_and_openreg_openreg_gloo(r: Rank):
    r.init("cpu:gloo,openreg:openreg_gloo")
    try:
        assert_group_serves_openreg_and_cpu(r)
    finally:
        dist.destroy_process_group()


@on_every_rank_with_its_own_group
def init_with_the_backend_name(r: Rank):
    r.init("openreg_gloo")
    try:
        assert_group_serves_openreg_and_cpu(r)
    finally:
        dist.destroy_process_group()


@on_every_rank_with_its_own_group
def init_with_an_openreg_device_id(r: Rank):
    r.init(device_id=r.device)
    try:
        assert dist.group.WORLD.name() == "openreg_gloo"
        assert_group_serves_openreg_and_cpu(r)
    finally:
        dist.destroy_process_group()


@on_every_rank_with_its_own_group
def destroy_process_group_waits_until_gloo_let_go_of_every_host_alias(r: Rank):
    # Gloo's thread must not be the one to free an alias's Python object: at exit that
    # aborts the process (docs/integration/distributed.md, "Exit").
    r.init()
    group = dist.group.WORLD
    t = per_rank(r, 1000).to(r.device)
    works = [dist.all_reduce(t, async_op=True) for _ in range(3)]
    for work in works:
        work.wait()
    del works
    dist.destroy_process_group()
    assert group._in_flight == []


def worker(rank: int, directory: Path) -> None:
    """One rank: every check in order; results go to rank<N>.json after each one."""
    import torch_openreg

    results = {"torch_openreg": torch_openreg.__file__}
    out = directory / f"rank{rank}.json"
    r = Rank(rank, WORLD, torch.device("openreg", rank), directory)
    torch.openreg.set_device(r.device)

    def run(name, check):
        try:
            check(r)
            results[name] = "ok"
        except BaseException as e:  # report everything; the parent decides
            results[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        out.write_text(json.dumps(results))

    r.init()  # no backend: torch picks openreg's default
    for name, check in CHECKS.items():
        run(name, check)
    dist.destroy_process_group()
    for name, check in INIT_CHECKS.items():
        run(name, check)
    results["done"] = "ok"
    out.write_text(json.dumps(results))


# --- launching, from the test process -------------------------------------------------------


@dataclass
class Launch:
    returncodes: list[int | None]
    timed_out: bool
    leftovers: list[int]
    logs: str
    directory: Path  # where the launched processes wrote


def _processes_with(token: str) -> list[int]:
    """The processes that inherited the environment variable marking one launch."""
    needle = f"OPENREG_TEST_LAUNCH={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours to read
                pass
    return found


def launch(commands: list[list[str]], directory: Path) -> Launch:
    """Runs the commands side by side, bounded by LAUNCH_TIMEOUT; kills them (and
    anything they started, found by an environment variable only they carry) when it
    runs out. Their output goes to files in ``directory``."""
    token = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OPENREG_TEST_LAUNCH=token)
    logs = [directory / f"process{i}.log" for i in range(len(commands))]
    processes = []
    for command, log in zip(commands, logs):
        with open(log, "wb") as f:
            processes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL))
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    timed_out = False
    for p in processes:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for pid in _processes_with(token):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in processes:
            p.wait()
    # Grandchildren (torchrun's workers) may still be exiting: give them a moment.
    leftovers = _processes_with(token)
    for _ in range(50):
        if not leftovers:
            break
        time.sleep(0.1)
        leftovers = _processes_with(token)
    text = "\n".join(f"--- {log.name}\n{_tail(log)}" for log in logs)
    return Launch([p.returncode for p in processes], timed_out, leftovers, text, directory)


def _tail(path: Path, lines: int = 60) -> str:
    """The end of a child's log, without the dispatch trace's lines."""
    kept = [line for line in path.read_text(errors="replace").splitlines() if not line.lstrip().startswith("[")]
    return "\n".join(kept[-lines:])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[list[dict], Launch]:
    directory = tmp_path_factory.mktemp("ranks")
    result = launch(
        [[sys.executable, str(Path(__file__)), "--rank", str(rank), "--directory", str(directory)]
         for rank in range(WORLD)],
        directory,
    )
    reports = []
    for rank in range(WORLD):
        path = directory / f"rank{rank}.json"
        reports.append(json.loads(path.read_text()) if path.exists() else {})
    return reports, result


@pytest.mark.parametrize("check", list(CHECKS) + list(INIT_CHECKS))
def test_on_two_ranks(two_ranks, check):
    reports, result = two_ranks
    for rank, report in enumerate(reports):
        outcome = report.get(check, "did not run")
        assert outcome == "ok", (
            f"rank {rank}: {check}: {outcome}\n(timed out: {result.timed_out}, exit codes: "
            f"{result.returncodes})\n{result.logs}"
        )


def test_ranks_import_this_worktrees_torch_openreg_and_finish(two_ranks):
    import torch_openreg

    reports, result = two_ranks
    assert not result.timed_out, result.logs
    assert result.returncodes == [0] * WORLD, result.logs
    for report in reports:
        assert report.get("torch_openreg") == torch_openreg.__file__
        assert report.get("done") == "ok", result.logs


def test_a_checkpoint_saved_on_two_ranks_loads_in_one_process(two_ranks):
    # distributed_checkpoint_saves_and_loads_sharded_tensors saved a DTensor sharded by
    # rows over two ranks; one process without a group loads it whole, on the device.
    import torch.distributed.checkpoint as dcp

    reports, result = two_ranks
    assert reports[0].get("distributed_checkpoint_saves_and_loads_sharded_tensors") == "ok", result.logs
    target = {"w": torch.zeros(4, 4, device="openreg"), "step": 0}
    dcp.load(target, checkpoint_id=str(result.directory / "checkpoint"), no_dist=True)
    assert target["step"] == 3
    assert target["w"].device.type == "openreg"
    torch.testing.assert_close(target["w"].cpu(), torch.arange(16.0).reshape(4, 4), rtol=0, atol=0)


def test_launches_leave_no_process_behind(two_ranks):
    _, result = two_ranks
    assert result.leftovers == [], f"processes left running: {result.leftovers}"


# --- in this process ----------------------------------------------------------------------


def test_openreg_gloo_is_the_default_backend_for_openreg_only():
    assert dist.Backend.default_device_backend_map["openreg"] == "openreg_gloo"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    assert dist.Backend.OPENREG_GLOO == "openreg_gloo"
    assert set(dist.Backend.backend_capability["openreg_gloo"]) == {"openreg", "cpu"}


def test_pg_options_must_be_gloos():
    from torch_openreg.openreg.distributed import ProcessGroupOpenRegGloo

    with pytest.raises(TypeError, match=r"takes ProcessGroupGloo options .* got str"):
        ProcessGroupOpenRegGloo(dist.HashStore(), 0, 1, options="fast")


def test_the_cpp_backend_refuses_a_group_class_that_leaves_a_collective_to_processgroup():
    # ProcessGroup's own reduce() would run c10d's op, which would ask the group for its
    # openreg backend again: refused when the backend is made, not a recursion later.
    from torch_openreg import _C

    class OnlyBroadcast(dist.ProcessGroup):
        def broadcast(self, tensors, opts=None):
            raise AssertionError("not called")

    with pytest.raises(RuntimeError, match=r"must define allreduce\(\)"):
        _C._process_group_backend(OnlyBroadcast(0, 1), 0, 1, "only_broadcast")


def test_the_cpp_backend_outliving_its_group_raises_naming_what_to_do():
    import gc

    from torch._C import _distributed_c10d as c10d
    from torch_openreg.openreg.distributed import ProcessGroupOpenRegGloo

    group = ProcessGroupOpenRegGloo(dist.HashStore(), 0, 1)
    backend = c10d.ProcessGroup._get_backend(group, torch.device("openreg", 0))
    t = torch.ones(3, device="openreg")
    backend.allreduce([t]).wait()  # one rank: the sum is the tensor
    assert_same(t, torch.ones(3), torch.device("openreg", 0))
    group.shutdown()
    del group
    gc.collect()
    with pytest.raises(RuntimeError, match=r"openreg_gloo allreduce: the process group this backend belongs to "
                       r"is gone \(destroy_process_group\(\)\); create a new group"):
        backend.allreduce([t])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one rank of tests/test_distributed.py")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--directory", type=Path, required=True)
    arguments = parser.parse_args()
    worker(arguments.rank, arguments.directory)
