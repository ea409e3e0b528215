"""Time operators on CPU and on openreg in the same run and print the ratio.

    python benchmarks/bench_ops.py [--json FILE] [--repeat N]

Each case runs interleaved (CPU, openreg, CPU, openreg, ...) and reports the
median per-call time; ratio = openreg / CPU (1.0 = as fast as CPU). Copies are
reported as GB/s against CPU's copy_ bandwidth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch

SMALL, LARGE = 16, 1 << 24


def per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.openreg.synchronize()
    return (time.perf_counter() - start) / calls


def compare(make: Callable[[str], Callable[[], object]], calls: int, repeat: int) -> tuple[float, float]:
    cpu, dev = make("cpu"), make("openreg")
    cpu(), dev()  # warm up
    cpu_t, dev_t = [], []
    for _ in range(repeat):
        cpu_t.append(per_call(cpu, calls))
        dev_t.append(per_call(dev, calls))
    return statistics.median(cpu_t), statistics.median(dev_t)


def binary(op: Callable, n: int) -> Callable[[str], Callable[[], object]]:
    def make(device: str):
        a, b = torch.randn(n, device=device), torch.randn(n, device=device)
        return lambda: op(a, b)
    return make


def unary(op: Callable, n: int) -> Callable[[str], Callable[[], object]]:
    def make(device: str):
        a = torch.randn(n, device=device)
        return lambda: op(a)
    return make


def copy_case(kind: str, n: int) -> Callable[[str], Callable[[], object]]:
    def make(device: str):
        if device == "cpu":
            src, dst = torch.randn(n), torch.empty(n)
        else:
            src = torch.randn(n, device="openreg" if kind in ("d2h", "d2d") else "cpu")
            dst = torch.empty(n, device="openreg" if kind in ("h2d", "d2d") else "cpu")
        return lambda: dst.copy_(src)
    return make


# name -> (the aten operator that decides native or fallback, case factory)
CASES = {
    "add": ("aten::add.Tensor", lambda n: binary(torch.add, n)),
    "mul": ("aten::mul.Tensor", lambda n: binary(torch.mul, n)),
    "exp": ("aten::exp", lambda n: unary(torch.exp, n)),
    "abs": ("aten::abs.out", lambda n: unary(torch.abs, n)),
    "cos": ("aten::cos", lambda n: unary(torch.cos, n)),
    "sum": ("aten::sum.dim_IntList", lambda n: unary(torch.sum, n)),
    "empty": ("aten::empty.memory_format", lambda n: (lambda d: (lambda: torch.empty(n, device=d)))),
    "view": ("aten::view", lambda n: unary(lambda a: a.view(-1, 1), n)),
}


def label(name: str, op: str) -> str:
    """The case name with how openreg runs it, asked of the dispatcher."""
    native = torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1")
    return f"{name} ({'native' if native else 'fallback'})"
COPIES = ("h2d", "d2h", "d2d")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for size_name, n, calls in (("small", SMALL, 2000), ("large", LARGE, 3)):
        for name, (op, case) in CASES.items():
            cpu, dev = compare(case(n), calls, args.repeat)
            rows.append({"op": label(name, op), "size": size_name, "numel": n, "cpu_us": cpu * 1e6,
                         "openreg_us": dev * 1e6, "ratio": dev / cpu})
        for kind in COPIES:
            cpu, dev = compare(copy_case(kind, n), calls, args.repeat)
            nbytes = n * 4
            rows.append({"op": f"copy {kind}", "size": size_name, "numel": n, "cpu_us": cpu * 1e6,
                         "openreg_us": dev * 1e6, "ratio": dev / cpu,
                         "cpu_GBps": nbytes / cpu / 1e9, "openreg_GBps": nbytes / dev / 1e9})
    print(f"{'op':<16} {'size':<6} {'cpu us':>10} {'openreg us':>11} {'ratio':>6}  GB/s (cpu / openreg)")
    for r in rows:
        bw = f"  {r['cpu_GBps']:.2f} / {r['openreg_GBps']:.2f}" if "cpu_GBps" in r else ""
        print(f"{r['op']:<16} {r['size']:<6} {r['cpu_us']:>10.2f} {r['openreg_us']:>11.2f} {r['ratio']:>6.2f}{bw}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
