"""Figures of the OpInfo conformance run (tests/test_opinfo.py), printed by
conftest.py at the end of the pytest output and written as JSON to the file
named by OPENREG_OPINFO_REPORT, if set."""

from __future__ import annotations

import collections
import json
import os

_ops: dict[str, dict] = {}


def record(name: str, **figures) -> None:
    _ops[name] = figures


def summary_lines() -> list[str]:
    if not _ops:
        return []
    ran = _ops
    samples = sum(f["samples"] for f in ran.values())
    failed = sum(f["failed"] for f in ran.values())
    seconds = sum(f["seconds"] for f in ran.values())
    reasons = collections.Counter(r for f in ran.values() for r in f["reasons"])
    lines = [
        f"OpInfo on openreg: {len(ran)} operators, {samples} sample runs "
        f"(contiguous, non-contiguous, out=), {samples - failed} match CPU "
        f"({100.0 * (samples - failed) / max(samples, 1):.2f}%), {failed} listed as expected failures; "
        f"{sum(not f['values_compared'] for f in ran.values())} operators compared by shape, "
        f"strides and dtype only; {seconds:.1f} s in the tests",
    ]
    for reason, count in reasons.most_common():
        lines.append(f"  {count:5d}  {reason}")
    report = os.environ.get("OPENREG_OPINFO_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({"operators": _ops, "samples": samples, "failed": failed}, f, indent=1, sort_keys=True)
        lines.append(f"  (per operator: {report})")
    return lines
