"""Collectives and an FSDP2 training step over gloo on two local processes: openreg
tensors (openreg_gloo, through CPU aliases) against CPU tensors (the same group, gloo on
plain CPU memory).

    python benchmarks/bench_distributed.py [--json FILE] [--repeat N] [--batch-ms MS] [--max-bytes B]
                                           [--fsdp-steps N]

Collectives: all_reduce, all_gather_into_tensor and reduce_scatter_tensor, each at 4 KiB,
4 MiB and 64 MiB (the size of the tensor each rank contributes; ``--max-bytes`` drops the
larger ones). FSDP2: one training step (forward, backward, AdamW step) of a small
transformer ``fully_shard``-ed layer by layer on a mesh of the two ranks, on openreg and
the same model on a CPU mesh.

Timed as bench_ops, bench_models and bench_aoti time: pairs of batches, one on CPU
tensors and one on openreg tensors, alternating which goes first; a batch is as many calls
as take about ``--batch-ms`` on CPU tensors (bench_ops.calls_per_batch, the larger of the
two ranks' counts, so that both run the same collectives), started together on both
ranks (a barrier), after one untimed batch of each. Reported: each device's median time
per call (or step), the algorithm bandwidth of the collectives (bytes each rank
contributes / time), and ratio = openreg / CPU, the median of the pairs' ratios with its
quartiles (1.0 = as fast as CPU tensors): the machine's speed drifts between batches,
and within a pair both devices ran in the same conditions (bench_ops.pair_ratios). The
ratio of the two medians, used before, moved between 1.0 and 1.6 from run to run at
4 KiB on a busy machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing

from bench_ops import alternating_pairs, calls_per_batch, pair_ratios, per_call, quartiles

WORLD = 2
SIZES = [1 << 10, 1 << 20, 1 << 24]  # float32 elements per rank: 4 KiB, 4 MiB, 64 MiB


def all_reduce(n: int, device: torch.device) -> Callable[[], None]:
    t = torch.ones(n, device=device)
    return lambda: dist.all_reduce(t)


def all_gather(n: int, device: torch.device) -> Callable[[], None]:
    t, out = torch.ones(n, device=device), torch.empty(WORLD * n, device=device)
    return lambda: dist.all_gather_single(out, t)  # all_gather_into_tensor's new name


def reduce_scatter(n: int, device: torch.device) -> Callable[[], None]:
    t, out = torch.ones(WORLD * n, device=device), torch.empty(n, device=device)
    return lambda: dist.reduce_scatter_single(out, t)  # reduce_scatter_tensor's new name


COLLECTIVES = {"all_reduce": all_reduce, "all_gather_into_tensor": all_gather, "reduce_scatter_tensor": reduce_scatter}


def batch(call: Callable[[], None], calls: int) -> float:
    """Seconds per call of ``calls`` calls, started on every rank at once."""
    dist.barrier()
    return per_call(call, calls)


def agreed_calls(cpu: Callable[[], None], batch_ms: float) -> int:
    """Calls per batch: bench_ops.calls_per_batch of the CPU call, the largest of the
    ranks' counts (each rank must run as many collectives as the others)."""
    calls = torch.tensor([calls_per_batch(cpu, batch_ms)])
    dist.all_reduce(calls, op=dist.ReduceOp.MAX)
    return int(calls.item())


def pairs(cpu: Callable[[], None], dev: Callable[[], None], calls: int, repeat: int) -> dict:
    """``repeat`` pairs of batches, alternating which device goes first, after one
    untimed batch of each (connections, allocator, gloo's threads: with 2 warm-up calls
    the first collective timed came out 1.3-2x slower)."""
    batch(cpu, calls), batch(dev, calls)
    # The order alternates the same way on every rank, which run the same collectives.
    cpu_t, dev_t = alternating_pairs(lambda _: batch(cpu, calls), lambda _: batch(dev, calls), repeat)
    ratios = pair_ratios(cpu_t, dev_t)
    return {"calls": calls, "cpu_s": statistics.median(cpu_t), "openreg_s": statistics.median(dev_t),
            "ratio": statistics.median(ratios), "ratio_quartiles": quartiles(ratios)}


class Block(torch.nn.Module):
    """A pre-norm transformer block: self-attention and an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attention = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def fsdp2_step(model: torch.nn.Module, device: torch.device, seed: int) -> Callable[[], None]:
    """One training step of ``model`` (a copy), fully_shard-ed per block over a mesh of
    ``device``'s type, on this rank's batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(model).to(device)
    mesh = init_device_mesh(device.type, (WORLD,))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, model[0].norm1.normalized_shape[0], generator=torch.Generator().manual_seed(seed))
    x = x.to(device)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def rank_main(rank: int, store: str, repeat: int, batch_ms: float, max_bytes: int, fsdp_steps: int, out: str) -> None:
    torch.openreg.set_device(rank)
    dist.init_process_group(init_method=f"file://{store}", rank=rank, world_size=WORLD)
    device = torch.device("openreg", rank)
    cpu = torch.device("cpu")
    rows = []
    for name, make in COLLECTIVES.items():
        for n in SIZES:
            if 4 * n > max_bytes:
                continue
            on_cpu, on_device = make(n, cpu), make(n, device)
            row = pairs(on_cpu, on_device, agreed_calls(on_cpu, batch_ms), repeat)
            rows.append({"collective": name, "elements": n, "bytes": 4 * n, **row,
                         "cpu_GBps": 4 * n / row["cpu_s"] / 1e9, "openreg_GBps": 4 * n / row["openreg_s"] / 1e9})
    fsdp = None
    if fsdp_steps:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(Block(128, 4) for _ in range(2)))
        row = pairs(fsdp2_step(model, cpu, rank), fsdp2_step(model, device, rank), fsdp_steps, repeat)
        fsdp = {"model": "2 transformer blocks, dim 128, batch 8x32 per rank", "parameters":
                sum(p.numel() for p in model.parameters()), **row}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rows": rows, "fsdp2": fsdp}, f)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the report to this file")
    parser.add_argument("--repeat", type=int, default=11, help="timed pairs of batches")
    parser.add_argument("--batch-ms", type=float, default=20.0, help="CPU time of one batch of collectives")
    parser.add_argument("--max-bytes", type=int, default=4 * SIZES[-1], help="largest collective size to run")
    parser.add_argument("--fsdp-steps", type=int, default=5, help="FSDP2 steps per batch (0: skip)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        torch.multiprocessing.spawn(
            rank_main,
            args=(os.path.join(tmp, "store"), args.repeat, args.batch_ms, args.max_bytes, args.fsdp_steps, out),
            nprocs=WORLD,
        )
        with open(out) as f:
            report = json.load(f)
    print(f"{'collective':<23} {'bytes':>10} {'calls':>6} {'cpu ms':>9} {'openreg ms':>11} {'cpu GB/s':>9} "
          f"{'openreg GB/s':>13} {'ratio (quartiles)':>19}")
    for r in report["rows"]:
        q1, q3 = r["ratio_quartiles"]
        print(f"{r['collective']:<23} {r['bytes']:>10} {r['calls']:>6} {r['cpu_s'] * 1e3:>9.3f} "
              f"{r['openreg_s'] * 1e3:>11.3f} {r['cpu_GBps']:>9.2f} {r['openreg_GBps']:>13.2f} "
              f"{r['ratio']:>6.2f} ({q1:.2f}-{q3:.2f})")
    fsdp = report["fsdp2"]
    if fsdp:
        q1, q3 = fsdp["ratio_quartiles"]
        print(f"\nFSDP2 training step ({fsdp['model']}, {fsdp['parameters']} parameters, "
              f"{fsdp['calls']} steps per batch):")
        print(f"  cpu {fsdp['cpu_s'] * 1e3:.2f} ms  openreg {fsdp['openreg_s'] * 1e3:.2f} ms  "
              f"ratio {fsdp['ratio']:.2f} ({q1:.2f}-{q3:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
