"""Time whole models on CPU and on openreg in the same run and print the ratio.

    python benchmarks/bench_models.py [--only gpt2,llama,...] [--phases forward,...]
                                      [--repeat N] [--batch-ms MS] [--profile N] [--json FILE]

The models and phases are tests/test_models.py's (tests/model_zoo.py): GPT-2,
Llama, BERT, T5, ViT and an LSTM+GRU language model, small and random-init, each
through an eval forward, an AdamW training step, greedy generation (the
generative ones), a bf16 autocast forward and a torch.compile forward (Inductor;
compiled on the warm-up call, then timed as a forward).

Each (model, phase) is timed as bench_ops.py times an operator (and with its
functions): pairs of batches, one batch of calls per device, in alternating order,
openreg synchronized at the end of every batch; ratio = openreg / CPU, the median
of the pairs' ratios, with their first and third quartile and a 95% confidence
interval of the median (bench_ops.median_interval). A batch takes about
--batch-ms of CPU time (the number of calls is set from the warm-up). The table
also lists the operators openreg ran on the CPU fallback during one call of the
phase (torch.openreg.fallback_stats()).

--profile N adds, per (model, phase), the N operators whose self time differs most
between the devices (torch.profiler key_averages over 5 batches on each device,
alternating), with their calls per phase call: where openreg's extra time goes.
The profiler's own cost per event inflates small operators on both sides alike.
Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

from bench_ops import calls_per_batch, median_interval, pair_ratios, per_call, quartiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import model_zoo as zoo  # noqa: E402  (tests/model_zoo.py: the models of tests/test_models.py)

DEV = "openreg"
# Pairs of batches per (model, phase). A training step's pairs differ by about
# +-0.15 (quartiles); 61 pairs put the median within about +-0.05 (the row's
# "median 95%"). Whole runs can differ by more: docs/performance.md,
# "Measuring".
REPEAT = 61
BATCH_MS = 20.0  # CPU time per batch


PROFILE_ROUNDS = 5  # profiled batches per device, alternating: one batch's self times move by 10-30%


def op_table(fn: Callable[[], Any], calls: int, into: dict[str, list[float]]) -> None:
    """Adds {operator: [calls, self CPU time in us]} over `calls` calls of fn to `into`."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.openreg.synchronize()
    for e in prof.key_averages():
        totals = into.setdefault(e.key, [0, 0.0])
        totals[0] += e.count
        totals[1] += e.self_cpu_time_total


def top_differences(cpu: Callable[[], Any], dev: Callable[[], Any], calls: int, n: int) -> list[dict[str, Any]]:
    """The n operators whose self time per phase call differs most (openreg - CPU),
    with their calls per phase call, over PROFILE_ROUNDS batches per device."""
    tables: tuple[dict, dict] = ({}, {})
    for _ in range(PROFILE_ROUNDS):
        op_table(cpu, calls, tables[0])
        op_table(dev, calls, tables[1])
    per_call = calls * PROFILE_ROUNDS
    rows = []
    for op in set(tables[0]) | set(tables[1]):
        c_calls, c_us = tables[0].get(op, (0, 0.0))
        d_calls, d_us = tables[1].get(op, (0, 0.0))
        rows.append({"op": op, "cpu_calls": c_calls / per_call, "openreg_calls": d_calls / per_call,
                     "cpu_us": c_us / per_call, "openreg_us": d_us / per_call, "diff_us": (d_us - c_us) / per_call})
    rows.sort(key=lambda r: -abs(r["diff_us"]))
    return rows[:n]


def measure(spec: zoo.ModelSpec, phase: zoo.Phase, repeat: int, batch_ms: float, profile_n: int) -> dict[str, Any]:
    pair = zoo.Pair(spec, DEV)
    cpu, dev = pair.prepare(phase)
    start = time.perf_counter()
    for _ in range(2):  # the first call compiles, for the compile phase
        cpu()
        dev()
    torch.openreg.synchronize()
    warmup_s = time.perf_counter() - start
    calls = calls_per_batch(cpu, batch_ms)
    torch.openreg.reset_fallback_stats()
    dev()
    torch.openreg.synchronize()
    fallback_ops = torch.openreg.fallback_stats()
    cpu_t, dev_t = [], []
    for i in range(repeat):
        # Alternating order, as bench_ops.measure: neither device always runs in the other's wake.
        if i % 2 == 0:
            cpu_t.append(per_call(cpu, calls))
            dev_t.append(per_call(dev, calls))
        else:
            dev_t.append(per_call(dev, calls))
            cpu_t.append(per_call(cpu, calls))
    ratios = pair_ratios(cpu_t, dev_t)
    row = {"model": spec.name, "phase": phase.name, "calls": calls,
           "cpu_ms": statistics.median(cpu_t) * 1e3, "openreg_ms": statistics.median(dev_t) * 1e3,
           "ratio": statistics.median(ratios), "ratio_quartiles": quartiles(ratios),
           "ratio_interval": median_interval(ratios),
           "warmup_s": warmup_s, "fallback_ops": fallback_ops}
    if profile_n:
        row["profile"] = top_differences(cpu, dev, calls, profile_n)
    return row


ROW = "{:<7} {:<14} {:>5} {:>10} {:>10} {:>6} {:<10} {:<10} {}"


def print_row(r: dict[str, Any]) -> None:
    q1, q3 = r["ratio_quartiles"]
    low, high = r["ratio_interval"]
    fallbacks = ", ".join(f"{op} x{n}" for op, n in r["fallback_ops"].items()) or "-"
    print(ROW.format(r["model"], r["phase"], r["calls"], f"{r['cpu_ms']:.3f}", f"{r['openreg_ms']:.3f}",
                     f"{r['ratio']:.2f}", f"{q1:.2f}-{q3:.2f}", f"{low:.2f}-{high:.2f}", fallbacks), flush=True)
    for p in r.get("profile", ()):
        print(f"    {p['op']:<52} calls {p['cpu_calls']:>6.1f} / {p['openreg_calls']:>6.1f}   "
              f"self us {p['cpu_us']:>9.1f} / {p['openreg_us']:>9.1f}   diff {p['diff_us']:>+9.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names, phases = [m.name for m in zoo.MODELS], [p.name for p in zoo.PHASES]
    parser.add_argument("--only", metavar="MODELS", help=f"comma list of models (default all: {','.join(names)})")
    parser.add_argument("--phases", metavar="PHASES", help=f"comma list of phases (default all: {','.join(phases)})")
    parser.add_argument("--repeat", type=int, default=REPEAT, help=f"timed pairs of batches (default {REPEAT})")
    parser.add_argument("--batch-ms", type=float, default=BATCH_MS,
                        help=f"CPU time per timed batch, which sets the calls per batch (default {BATCH_MS:g})")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also list the N operators whose self time differs most between the devices")
    parser.add_argument("--json", metavar="FILE", help="also write the rows to FILE")
    args = parser.parse_args(argv)
    models = args.only.split(",") if args.only else names
    wanted = args.phases.split(",") if args.phases else phases
    unknown = [m for m in models if m not in zoo.BY_NAME] + [p for p in wanted if p not in zoo.PHASE_BY_NAME]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}: the models are {', '.join(names)}; "
                     f"the phases {', '.join(phases)}")
    if args.repeat < 1 or args.batch_ms <= 0 or args.profile < 0:
        parser.error("--repeat must be at least 1, --batch-ms positive, --profile at least 0")
    warnings.filterwarnings("ignore")

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, repeat {args.repeat}, "
          f"batches of ~{args.batch_ms:g} ms; ratio = openreg / CPU")
    print(ROW.format("model", "phase", "calls", "cpu ms", "openreg ms", "ratio", "q1-q3", "median 95%", "CPU fallback"))
    rows, errors = [], []
    for spec in (zoo.BY_NAME[m] for m in models):
        for phase in (zoo.PHASE_BY_NAME[p] for p in wanted):
            if not phase.applies_to(spec):
                continue
            try:
                row = measure(spec, phase, args.repeat, args.batch_ms, args.profile)
            except Exception as e:  # a phase openreg cannot run yet: say so, time the others
                errors.append({"model": spec.name, "phase": phase.name,
                               "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
                print(ROW.format(spec.name, phase.name, "", "", "", "", "", "", f"error: {errors[-1]['error']}"),
                      flush=True)
                continue
            finally:
                if phase.name == "compile":
                    torch._dynamo.reset()
            rows.append(row)
            print_row(row)
    if rows:
        ratios = [r["ratio"] for r in rows]
        worst = max(rows, key=lambda r: r["ratio"])
        print(f"\n{len(rows)} cases: median ratio {statistics.median(ratios):.2f}, max {worst['ratio']:.2f} "
              f"({worst['model']} {worst['phase']}); {sum(bool(r['fallback_ops']) for r in rows)} with CPU "
              f"fallbacks; {len(errors)} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "repeat": args.repeat,
                       "batch_ms": args.batch_ms, "rows": rows, "errors": errors}, f, indent=1)
    bad = [f"{r['model']} {r['phase']}" for r in rows if not (math.isfinite(r["ratio"]) and r["ratio"] > 0)]
    if bad:
        print("error: no usable time for", ", ".join(bad), file=sys.stderr)
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
