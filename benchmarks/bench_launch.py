"""Kernel launches: 1,000 small kernels from launch to synchronize, and the launch latency.

    python benchmarks/bench_launch.py [--repeat N] [--kernels N] [--elements N] [--json FILE]

Both measurements use `torch.add` of two float tensors, timed on CPU and on
openreg in the same run, in alternating batches; the median of each is kept.

- sequence: `kernels` adds in a row, then `torch.openreg.synchronize()`, per
  add. With the stream idle at the start, a small add runs at once in the
  launching thread (docs/integration/streams.md, "Kernels"), so this is the time to result
  of a program of small operators. Ratio = openreg / CPU.
- queued launch: the same adds issued while the stream is busy
  (`torch.openreg._sleep`), so each is queued; the time until the call returns,
  per add, is the launch latency, and ratio = latency / CPU's add (which runs
  its kernel too). This is what every launch costs with
  OPENREG_QUEUE_ALL_KERNELS=1.
- graph replay: the same adds captured once into a graph (torch.openreg.graph),
  then `replay()` and `synchronize()`, per add: the time to result when the
  launches skip the dispatcher, as CUDA graphs are for. Ratio = openreg / CPU's
  sequence.

Printed, never asserted (tests/test_benchmarks.py runs it once, scaled down).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

DEVICE = "openreg"


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def sequence(a, b, kernels: int, sync) -> float:
    def run():
        for _ in range(kernels):
            torch.add(a, b)
        sync()

    return per_call_us(run, 1) / kernels


def queued_launch(a, b, kernels: int) -> float:
    torch.openreg.synchronize()
    # Long enough that the stream stays busy while `kernels` launches return.
    torch.openreg._sleep(max(5.0, kernels * 0.02))
    start = time.perf_counter()
    for _ in range(kernels):
        torch.add(a, b)
    latency = (time.perf_counter() - start) / kernels * 1e6
    torch.openreg.synchronize()
    return latency


def graph_replay(a, b, kernels: int):
    """A graph of `kernels` adds (captured after a warm-up) and the per-add time of
    one replay to result."""
    g = torch.openreg.OpenRegGraph()
    with torch.openreg.graph(g):
        for _ in range(kernels):
            torch.add(a, b)

    def replay() -> float:
        def run():
            g.replay()
            torch.openreg.synchronize()

        return per_call_us(run, 1) / kernels

    return g, replay


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=31, help="timed batches per measurement (median kept)")
    parser.add_argument("--kernels", type=int, default=1000, help="adds per batch")
    parser.add_argument("--elements", type=int, default=16, help="elements of each operand")
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = parser.parse_args(argv)

    tensors = {d: (torch.randn(args.elements, device=d), torch.randn(args.elements, device=d)) for d in ("cpu", DEVICE)}
    syncs = {"cpu": lambda: None, DEVICE: torch.openreg.synchronize}
    for d in tensors:  # warm up: first launches of a dtype combination run in the calling thread
        sequence(*tensors[d], 10, syncs[d])

    graph, replay = graph_replay(*tensors[DEVICE], args.kernels)
    cpu, seq, launch, replayed = [], [], [], []
    for i in range(args.repeat):
        order = ("cpu", DEVICE) if i % 2 == 0 else (DEVICE, "cpu")
        for d in order:
            (cpu if d == "cpu" else seq).append(sequence(*tensors[d], args.kernels, syncs[d]))
        launch.append(queued_launch(*tensors[DEVICE], args.kernels))
        replayed.append(replay())
    del graph

    cpu_us, seq_us, launch_us, replay_us = (statistics.median(x) for x in (cpu, seq, launch, replayed))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.kernels} adds of {args.elements} "
          f"floats per batch, median of {args.repeat} batches")
    print(f"{'measurement':<34}{'cpu us':>10}{'openreg us':>12}{'ratio':>8}")
    print(f"{'sequence, launch to sync (per add)':<34}{cpu_us:>10.3f}{seq_us:>12.3f}{seq_us / cpu_us:>8.2f}")
    print(f"{'queued launch latency (per add)':<34}{cpu_us:>10.3f}{launch_us:>12.3f}{launch_us / cpu_us:>8.2f}")
    print(f"{'graph replay to sync (per add)':<34}{cpu_us:>10.3f}{replay_us:>12.3f}{replay_us / cpu_us:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "kernels": args.kernels, "elements": args.elements,
                       "cpu_us": cpu_us, "sequence_us": seq_us, "queued_launch_us": launch_us,
                       "graph_replay_us": replay_us}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
