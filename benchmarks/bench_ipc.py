"""Hand-off of a tensor to another process through a torch.multiprocessing queue.

    python benchmarks/bench_ipc.py [--mib N] [--repeat N] [--method spawn|forkserver] [--json FILE]

One spawned child receives tensors from a queue and answers each with a small
message once it holds the tensor (and has let go of it). The time from `put`
to the answer, median over `repeat` hand-offs, is measured for an openreg
tensor (shared as CUDA IPC shares device memory: docs/integration/ipc.md)
and for a CPU tensor already in shared memory (`share_memory_()`, torch's
file_descriptor strategy), alternating, in the same run. Neither copies the
tensor's bytes: the cost is the pickling, the passing of file descriptors and
the mapping. Ratio = openreg / CPU.

Printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

import torch_openreg  # noqa: F401

TIMEOUT = 60


def receiver(inbox, answers) -> None:
    while True:
        x = inbox.get(timeout=TIMEOUT)
        if x is None:
            return
        shape = tuple(x.shape)
        del x
        answers.put(shape)


def hand_off(inbox, answers, x) -> float:
    start = time.perf_counter()
    inbox.put(x)
    answers.get(timeout=TIMEOUT)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--method", default="spawn", choices=["spawn", "forkserver"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    ctx = mp.get_context(args.method)
    inbox, answers = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=receiver, args=(inbox, answers), daemon=True)
    child.start()
    try:
        numel = args.mib * (1 << 20) // 4
        device = torch.randn(numel, device="openreg")
        host = torch.randn(numel).share_memory_()
        hand_off(inbox, answers, device)  # warm up: the child imports and initialises openreg
        hand_off(inbox, answers, host)
        times = {"openreg": [], "cpu": []}
        for _ in range(args.repeat):
            times["openreg"].append(hand_off(inbox, answers, device))
            times["cpu"].append(hand_off(inbox, answers, host))
        inbox.put(None)
        child.join(TIMEOUT)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    torch.openreg.ipc_collect()
    openreg_ms = statistics.median(times["openreg"]) * 1e3
    cpu_ms = statistics.median(times["cpu"]) * 1e3
    report = {
        "mib": args.mib,
        "repeat": args.repeat,
        "method": args.method,
        "openreg_ms": openreg_ms,
        "cpu_shared_ms": cpu_ms,
        "ratio": openreg_ms / cpu_ms,
    }
    print(
        f"hand-off of a {args.mib} MiB tensor ({args.method}, median of {args.repeat}): "
        f"openreg {openreg_ms:.3f} ms, CPU shared memory {cpu_ms:.3f} ms, ratio {openreg_ms / cpu_ms:.2f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
