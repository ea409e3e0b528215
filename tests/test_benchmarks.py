"""The benchmarks run and report every case. Smoke tests: they time a handful
of calls and assert no ratio (timing belongs to the benchmark's own output)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import model_zoo  # tests/model_zoo.py, the benchmark's models
from torch_openreg import info

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
BENCH_OPS = ROOT / "benchmarks" / "bench_ops.py"
BENCH_MODELS = ROOT / "benchmarks" / "bench_models.py"
BENCH_LAUNCH = ROOT / "benchmarks" / "bench_launch.py"
BENCH_IPC = ROOT / "benchmarks" / "bench_ipc.py"


def load_bench_ops():
    spec = importlib.util.spec_from_file_location("bench_ops", BENCH_OPS)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the module up in sys.modules to resolve string annotations.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def bench_ops_cases() -> list:
    return list(load_bench_ops().CASES)


def run_benchmark(script: Path, json_path: Path, *args: str) -> dict:
    # The default configuration, whatever switches this run has: a traced run would
    # print a line per timed call, OPENREG_FALLBACK=error stop the fallback cases.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENREG_", "TORCH_SHOW_", "TORCH_OPENREG_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    result = subprocess.run(
        [sys.executable, str(script), *args, "--json", str(json_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(json_path.read_text())


def run_bench_ops(json_path: Path) -> dict:
    return run_benchmark(BENCH_OPS, json_path, "--size", "small", "--repeat", "1", "--calls-scale", "0.005")


def test_bench_ops_reports_every_case_with_finite_positive_times(tmp_path):
    report = run_bench_ops(tmp_path / "bench_ops.json")
    rows = report["rows"]
    assert [r["op"] for r in rows] == [c.name for c in bench_ops_cases()]
    for r in rows:
        assert r["size"] == "small"
        assert r["label"] in info.CATEGORIES, r
        for key in ("cpu_us", "openreg_us", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["op"], key, r[key])
    copies = [r for r in rows if r["op"].startswith("copy ")]
    assert [r["op"] for r in copies] == ["copy h2d", "copy d2h", "copy d2d"]
    for r in copies:
        assert r["cpu_GBps"] > 0 and r["openreg_GBps"] > 0
    # The summary accounts for every row once, and so does the table per route.
    assert sum(s["cases"] for s in report["summary"]) == len(rows)
    assert "copies" in {s["group"] for s in report["summary"]}
    assert sum(s["cases"] for s in report["routes"]) == len(rows) - len(copies)
    assert {"fallback", "structured", "cpu_kernel"} <= {s["route"] for s in report["routes"]}


def test_bench_models_reports_every_model_and_phase_with_its_fallbacks(tmp_path):
    # The compiled forward is left out: a cold Inductor compile of six models takes
    # minutes (tests/test_models.py compiles three of them).
    phases = ["forward", "train_step", "generate", "autocast_bf16"]
    report = run_benchmark(BENCH_MODELS, tmp_path / "bench_models.json", "--repeat", "1", "--batch-ms", "0.001",
                           "--phases", ",".join(phases))
    expected = [(m.name, p) for m in model_zoo.MODELS for p in phases if model_zoo.PHASE_BY_NAME[p].applies_to(m)]
    assert [(r["model"], r["phase"]) for r in report["rows"]] == expected
    assert report["errors"] == []
    for r in report["rows"]:
        for key in ("cpu_ms", "openreg_ms", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["model"], r["phase"], key, r[key])
        assert r["calls"] == 1
        assert r["ratio_interval"] == [r["ratio"], r["ratio"]]  # one pair: its ratio
        assert isinstance(r["fallback_ops"], dict)
        assert "profile" not in r
    # The profiled comparison (ten profiled batches per row) for one model's forward.
    model = model_zoo.MODELS[0].name
    report = run_benchmark(BENCH_MODELS, tmp_path / "profiled.json", "--repeat", "1", "--batch-ms", "0.001",
                           "--phases", "forward", "--only", model, "--profile", "2")
    assert [(r["model"], r["phase"]) for r in report["rows"]] == [(model, "forward")] and report["errors"] == []
    for r in report["rows"]:
        assert len(r["profile"]) == 2 and all(p["op"] for p in r["profile"])


def test_median_interval_is_the_sign_tests():
    median_interval = load_bench_ops().median_interval
    # 61 values: the 23rd and the 39th (P(Binomial(61, 1/2) <= 22) = 2.0%, <= 23: 3.6%);
    # 21 values: the 6th and the 16th; up to 8 values, the whole range.
    assert median_interval([float(v) for v in range(61, 0, -1)]) == (23.0, 39.0)
    assert median_interval([float(v) for v in range(1, 22)]) == (6.0, 16.0)
    assert median_interval([float(v) for v in range(1, 10)]) == (2.0, 8.0)
    assert median_interval([float(v) for v in range(8, 0, -1)]) == (1.0, 8.0)
    assert median_interval([1.5]) == (1.5, 1.5)


def test_bench_launch_reports_the_sequence_and_the_queued_launch_latency(tmp_path):
    report = run_benchmark(BENCH_LAUNCH, tmp_path / "bench_launch.json", "--repeat", "1", "--kernels", "20")
    assert report["kernels"] == 20
    for key in ("cpu_us", "sequence_us", "queued_launch_us", "graph_replay_us"):
        assert math.isfinite(report[key]) and report[key] > 0, (key, report[key])


def test_bench_distributed_reports_every_collective_and_the_fsdp2_step(tmp_path):
    # Two ranks, the 4 KiB size only, two pairs of 1 ms batches and one FSDP2 step per batch.
    report = run_benchmark(ROOT / "benchmarks" / "bench_distributed.py", tmp_path / "bench_distributed.json",
                           "--repeat", "2", "--batch-ms", "1", "--max-bytes", "4096", "--fsdp-steps", "1")
    rows = report["rows"]
    assert [(r["collective"], r["bytes"]) for r in rows] == [
        ("all_reduce", 4096), ("all_gather_into_tensor", 4096), ("reduce_scatter_tensor", 4096)]
    fsdp = report["fsdp2"]
    assert fsdp["parameters"] > 0
    for r in [*rows, fsdp]:
        assert r["calls"] >= 1
        for key in ("cpu_s", "openreg_s", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r[key])
        q1, q3 = r["ratio_quartiles"]
        assert 0 < q1 <= r["ratio"] <= q3, r


def test_bench_ipc_reports_both_hand_off_times(tmp_path):
    report = run_benchmark(BENCH_IPC, tmp_path / "bench_ipc.json", "--mib", "1", "--repeat", "2")
    assert report["mib"] == 1
    for key in ("openreg_ms", "cpu_shared_ms", "ratio"):
        assert math.isfinite(report[key]) and report[key] > 0, (key, report[key])


def test_bench_memory_reports_both_peaks(tmp_path):
    report = run_benchmark(ROOT / "benchmarks" / "bench_memory.py", tmp_path / "bench_memory.json",
                           "--widths", "64", "--rounds", "1")
    for device in ("cpu", "openreg"):
        assert report[device]["peak_rss_mb"] > 100, report  # torch alone is more
    assert report["openreg"]["peak_reserved"] > 0
    assert math.isfinite(report["ratio"]) and report["ratio"] > 0
