"""all_reduce throughput over gloo on two local processes: openreg tensors (openreg_gloo,
through CPU aliases) against CPU tensors (the same group, gloo on plain CPU memory).

    python benchmarks/bench_distributed.py [--json FILE] [--repeat N]

Sizes run interleaved (CPU, openreg, CPU, openreg, ...); reported: the median time per
all_reduce and its algorithm bandwidth (bytes of the tensor / time), and the ratio
openreg / CPU of the times (1.0 = as fast as CPU tensors).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing

SIZES = [1 << 10, 1 << 20, 1 << 24]  # float32 elements: 4 KiB, 4 MiB, 64 MiB


def per_call(t: torch.Tensor, calls: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / calls


def rank_main(rank: int, store: str, repeat: int, out: str) -> None:
    torch.openreg.set_device(rank)
    dist.init_process_group(init_method=f"file://{store}", rank=rank, world_size=2)
    rows = []
    for n in SIZES:
        calls = max(2, min(200, (1 << 26) // (n * 4)))
        cpu, dev = torch.ones(n), torch.ones(n, device=f"openreg:{rank}")
        per_call(cpu, 2), per_call(dev, 2)  # warm up: connections, allocator
        cpu_t, dev_t = [], []
        for _ in range(repeat):
            cpu_t.append(per_call(cpu, calls))
            dev_t.append(per_call(dev, calls))
        c, d = statistics.median(cpu_t), statistics.median(dev_t)
        rows.append({"elements": n, "bytes": 4 * n, "cpu_s": c, "openreg_s": d,
                     "cpu_GBps": 4 * n / c / 1e9, "openreg_GBps": 4 * n / d / 1e9, "ratio": d / c})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        torch.multiprocessing.spawn(rank_main, args=(os.path.join(tmp, "store"), args.repeat, out), nprocs=2)
        with open(out) as f:
            rows = json.load(f)
    print(f"{'bytes':>10} {'cpu ms':>9} {'openreg ms':>11} {'cpu GB/s':>9} {'openreg GB/s':>13} {'ratio':>6}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['cpu_s'] * 1e3:>9.3f} {r['openreg_s'] * 1e3:>11.3f} "
              f"{r['cpu_GBps']:>9.2f} {r['openreg_GBps']:>13.2f} {r['ratio']:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
