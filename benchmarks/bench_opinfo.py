"""Time of running PyTorch's OpInfo sample inputs on openreg against CPU.

For every OpInfo in op_db (float32, the first --samples samples), the same call
runs on CPU tensors and on openreg tensors, interleaved, --repeat times; the
inputs are moved to the device beforehand and not timed. Samples that raise on
either device are left out of both sums. Prints the total ratio, the native and
fallback shares, and the operators that cost the most relative to CPU.

    python benchmarks/bench_opinfo.py [--samples 3] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
import torch_openreg  # noqa: F401  (registers the device when autoload is off)
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_map

DEV = "openreg"


def to_device(x):
    return tree_map(lambda v: v.to(DEV) if isinstance(v, torch.Tensor) else v, x)


def timed(fn, args, kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def is_native(op) -> bool:
    """Whether the OpInfo's aten operator (found by name, so a composite OpInfo
    counts as fallback) has an openreg kernel."""
    name = op.name.replace(".", "_") if op.name.startswith("special.") else op.name.split(".")[-1]
    for overload in ("", ".Tensor", ".out", ".default"):
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}{overload}", "PrivateUse1"):
                return True
        except RuntimeError:
            pass
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write per-operator results to this file")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[: args.samples]
        except Exception:  # a few OpInfos need optional packages
            continue
        cpu_total = dev_total = 0.0
        for sample in samples:
            cpu_args = (sample.input, *sample.args)
            try:
                dev_args = to_device(cpu_args)
                dev_kwargs = to_device(sample.kwargs)
                op.op(*cpu_args, **sample.kwargs)  # warm up both, and drop samples that raise
                op.op(*dev_args, **dev_kwargs)
            except Exception:
                continue
            for _ in range(args.repeat):
                cpu_total += timed(op.op, cpu_args, sample.kwargs)
                dev_total += timed(op.op, dev_args, dev_kwargs)
        if cpu_total > 0:
            rows.append({"op": f"{op.name}{'.' + op.variant_test_name if op.variant_test_name else ''}",
                         "native": is_native(op), "cpu_s": cpu_total, "openreg_s": dev_total})
    cpu = sum(r["cpu_s"] for r in rows)
    dev = sum(r["openreg_s"] for r in rows)
    print(f"{len(rows)} OpInfos, float32, {args.samples} samples each, {args.repeat} repeats")
    print(f"total: cpu {cpu:.3f} s, openreg {dev:.3f} s, ratio {dev / cpu:.2f}")
    for native in (True, False):
        part = [r for r in rows if r["native"] == native]
        c, d = sum(r["cpu_s"] for r in part), sum(r["openreg_s"] for r in part)
        if c:
            print(f"  {'native' if native else 'fallback'}: {len(part)} ops, ratio {d / c:.2f}")
    print("largest ratios (openreg / cpu):")
    for r in sorted(rows, key=lambda r: r["openreg_s"] / r["cpu_s"], reverse=True)[:15]:
        print(f"  {r['op']:<40} {r['openreg_s'] / r['cpu_s']:6.2f}  ({'native' if r['native'] else 'fallback'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
