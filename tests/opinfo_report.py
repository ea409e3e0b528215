"""Figures of the conformance runs against CPU, OpInfo (tests/test_opinfo.py,
tests/test_opinfo_beyond_samples.py) and ModuleInfo (tests/test_modules.py), printed by conftest.py at the end of
the pytest output and written as JSON to the files named by
OPENREG_OPINFO_REPORT and OPENREG_MODULEINFO_REPORT, if set."""

from __future__ import annotations

import collections
import json
import os

_ops: dict[str, dict] = {}
_modules: dict[str, dict] = {}
_beyond: dict[str, dict] = {}


def record(name: str, **figures) -> None:
    """One OpInfo's figures: samples, failed, reasons (one per listed failure),
    seconds, values_compared, problems."""
    _ops[name] = figures


def record_module(name: str, **figures) -> None:
    """One ModuleInfo's figures: samples ({kind: runs}), failed ({kind:
    failures}), reasons (one per listed failure), seconds, problems."""
    _modules[name] = figures


def record_beyond(name: str, **figures) -> None:
    """One OpInfo's figures beyond its samples: samples ({kind: runs}), failed
    ({kind: failures}), all of them listed as expected failures."""
    _beyond[name] = figures


def state() -> dict:
    """What this process recorded, for the process that prints the summary
    (with pytest-xdist, each worker records its share; conftest.py sends it)."""
    return {"ops": _ops, "modules": _modules, "beyond": _beyond}


def merge(recorded: dict) -> None:
    _ops.update(recorded["ops"])
    _modules.update(recorded["modules"])
    _beyond.update(recorded["beyond"])


def summary_lines() -> list[str]:
    return _opinfo_lines() + _beyond_lines() + _moduleinfo_lines()


def _reason_lines(figures: dict[str, dict]) -> list[str]:
    reasons = collections.Counter(r for f in figures.values() for r in f["reasons"])
    return [f"  {count:5d}  {reason}" for reason, count in reasons.most_common()]


def _write(variable: str, per: str, data: dict) -> list[str]:
    report = os.environ.get(variable)
    if not report:
        return []
    with open(report, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    return [f"  (per {per}: {report})"]


def _opinfo_lines() -> list[str]:
    if not _ops:
        return []
    ran = _ops
    samples = sum(f["samples"] for f in ran.values())
    failed = sum(f["failed"] for f in ran.values())
    seconds = sum(f["seconds"] for f in ran.values())
    lines = [
        f"OpInfo on openreg: {len(ran)} operators, {samples} sample runs "
        f"(contiguous, non-contiguous, out=), {samples - failed} match CPU "
        f"({100.0 * (samples - failed) / max(samples, 1):.2f}%), {failed} listed as expected failures; "
        f"{sum(not f['values_compared'] for f in ran.values())} operators compared by shape, "
        f"strides and dtype only; {seconds:.1f} s in the tests",
    ]
    lines += _reason_lines(ran)
    lines += _write("OPENREG_OPINFO_REPORT", "operator", {"operators": _ops, "samples": samples, "failed": failed})
    return lines


def _by_kind(figures: dict[str, dict]) -> tuple[collections.Counter, collections.Counter]:
    runs, failed = collections.Counter(), collections.Counter()
    for f in figures.values():
        runs.update(f["samples"])
        failed.update(f["failed"])
    return runs, failed


def _beyond_lines() -> list[str]:
    if not _beyond:
        return []
    runs, failed = _by_kind(_beyond)
    total, differ = sum(runs.values()), sum(failed.values())
    return [
        f"OpInfo beyond samples on openreg: {len(_beyond)} operators, {total} runs, {total - differ} match CPU "
        f"({100.0 * (total - differ) / max(total, 1):.2f}%), {differ} listed as expected failures",
        "  " + ", ".join(f"{kind} {runs[kind] - failed[kind]}/{runs[kind]}" for kind in sorted(runs)),
    ]


def _moduleinfo_lines() -> list[str]:
    if not _modules:
        return []
    ran = _modules
    by_kind, failed_by_kind = _by_kind(ran)
    samples, failed = sum(by_kind.values()), sum(failed_by_kind.values())
    seconds = sum(f["seconds"] for f in ran.values())
    differing = sum(bool(sum(f["failed"].values())) for f in ran.values())
    lines = [
        f"ModuleInfo on openreg: {len(ran)} modules, {samples} sample runs, {samples - failed} match CPU "
        f"({100.0 * (samples - failed) / max(samples, 1):.2f}%), {failed} differ in "
        f"{differing} module{'' if differing == 1 else 's'} "
        f"({sum(len(f['reasons']) for f in ran.values())} listed as expected failures); {seconds:.1f} s in the tests",
        "  " + ", ".join(f"{kind} {by_kind[kind] - failed_by_kind[kind]}/{by_kind[kind]}" for kind in by_kind),
    ]
    lines += _reason_lines(ran)
    lines += _write("OPENREG_MODULEINFO_REPORT", "module", {"modules": _modules, "samples": samples, "failed": failed})
    return lines
