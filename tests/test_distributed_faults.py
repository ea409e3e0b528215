"""Faults on the openreg_gloo backend: a rank that dies or hangs, and ranks whose
collectives disagree on sizes. The surviving rank must raise, within the process group's
timeout (PG_TIMEOUT here), an error naming the collective, never hang.

Each fault launches two processes once (this file, one per rank; test_distributed.launch,
whose hard timeout kills them if the fault is not detected), which run every collective of
its cases at once; each case asserts on the error rank 0 recorded for its collective.
Children write their reports to files, never to stdout (see test_distributed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from test_distributed import WORLD, launch

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

PG_TIMEOUT = datetime.timedelta(seconds=5)

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds leftover processes in /proc"),
    pytest.mark.xdist_group("distributed"),
]


# --- what the surviving rank (0) runs while rank 1 is gone, each on a group of its own ----------


def all_reduce(device, group):
    dist.all_reduce(torch.ones(4, device=device), group=group)


def all_reduce_async_then_wait(device, group):
    dist.all_reduce(torch.ones(4, device=device), group=group, async_op=True).wait()


def all_gather_into_tensor(device, group):
    dist.all_gather_into_tensor(torch.empty(WORLD * 4, device=device), torch.ones(4, device=device), group=group)


def reduce_scatter_tensor(device, group):
    dist.reduce_scatter_tensor(torch.empty(4, device=device), torch.ones(WORLD * 4, device=device), group=group)


def functional_all_gather(device, group):
    # C++ (_c10d_functional.wait_tensor) waits on the work through torch's PyWork trampoline.
    import torch.distributed._functional_collectives as funcol

    funcol.all_gather_tensor(torch.ones(4, device=device), 0, group).cpu()


COLLECTIVES = {f.__name__: f for f in (all_reduce, all_reduce_async_then_wait, all_gather_into_tensor,
                                       reduce_scatter_tensor, functional_all_gather)}
# The name the error gives each of them (the ProcessGroup method gloo ran).
NAMED = {"all_reduce": "allreduce", "all_reduce_async_then_wait": "allreduce",
         "all_gather_into_tensor": "all_gather_into_tensor", "reduce_scatter_tensor": "reduce_scatter_tensor",
         "functional_all_gather": "all_gather_into_tensor_coalesced"}
# The collectives each fault is checked with: one launch per fault, one group per collective.
FAULTS = {"dies": ["all_reduce", "reduce_scatter_tensor"], "hangs": list(COLLECTIVES)}


def record(report: dict, name: str, call) -> None:
    try:
        call()
        report[name] = "returned"
    except Exception as e:
        report[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


def worker(rank: int, scenario: str, directory: Path) -> None:
    torch.openreg.set_device(rank)
    device = torch.device("openreg", rank)
    if scenario == "mismatch":
        # torch's switch for checking that the ranks' collectives agree (c10d's
        # ProcessGroupWrapper); set before the group is created.
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()
    dist.init_process_group(init_method=f"file://{directory / 'store'}", rank=rank, world_size=WORLD,
                            timeout=PG_TIMEOUT)
    out = directory / f"rank{rank}.json"
    report: dict = {}
    if scenario in FAULTS:
        # A group per collective: a collective that failed leaves its group unusable.
        groups = {name: dist.new_group(timeout=PG_TIMEOUT) for name in FAULTS[scenario]}
        dist.barrier()  # both ranks are up and connected
        if rank == 1:
            if scenario == "dies":
                os._exit(3)
            # Hangs: never joins the collectives, and leaves once rank 0 has reported.
            deadline = time.monotonic() + 90
            while not (directory / "rank0.json").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            os._exit(0)
        # Side by side, each in a thread: the timeouts run out together.
        def run_on(name: str, group) -> None:
            record(report, name, lambda: COLLECTIVES[name](device, group))

        threads = [threading.Thread(target=run_on, args=item) for item in groups.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elif scenario == "mismatch":
        n = 4 + rank  # rank 0 has 4 elements, rank 1 has 5
        record(report, "all_reduce", lambda: dist.all_reduce(torch.ones(n, device=device)))
        record(report, "all_gather_into_tensor", lambda: dist.all_gather_into_tensor(
            torch.empty(WORLD * n, device=device), torch.ones(n, device=device)))
        # The check raised before gloo saw anything: the group still works.
        t = torch.ones(3, device=device)
        record(report, "all_reduce_after", lambda: dist.all_reduce(t))
        report["after"] = t.cpu().tolist()
        dist.destroy_process_group()
    out.write_text(json.dumps(report))
    os._exit(0)  # a group whose peer is gone cannot be destroyed cleanly


def run(tmp_path: Path, scenario: str) -> list[dict]:
    result = launch(
        [[sys.executable, str(Path(__file__)), "--rank", str(rank), "--scenario", scenario,
          "--directory", str(tmp_path)] for rank in range(WORLD)],
        tmp_path,
    )
    assert not result.timed_out, f"the launch hung and was killed\n{result.logs}"
    assert result.leftovers == [], result.leftovers
    reports = []
    for rank in range(WORLD):
        path = tmp_path / f"rank{rank}.json"
        reports.append(json.loads(path.read_text()) if path.exists() else {})
    assert reports[0], f"rank 0 reported nothing (exit codes {result.returncodes})\n{result.logs}"
    return reports


@pytest.fixture(scope="module")
def surviving_rank(tmp_path_factory):
    """What rank 0 recorded under each fault: one launch per fault, its tests share it."""
    reports = {}

    def report(scenario: str) -> dict:
        if scenario not in reports:
            reports[scenario] = run(tmp_path_factory.mktemp(scenario), scenario)[0]
        return reports[scenario]

    return report


@pytest.mark.parametrize("collective", FAULTS["dies"])
def test_a_rank_that_dies_makes_the_other_raise_naming_the_collective(surviving_rank, collective):
    outcome = surviving_rank("dies")[collective]
    # Before, the openreg all_reduce returned normally with its tensor unreduced.
    assert outcome.startswith("DistBackendError: ") or outcome.startswith("RuntimeError: "), outcome
    assert f"openreg_gloo {NAMED[collective]}: " in outcome, outcome


@pytest.mark.parametrize("collective", FAULTS["hangs"])
def test_a_rank_that_hangs_makes_the_other_raise_after_the_timeout_naming_the_collective(surviving_rank, collective):
    outcome = surviving_rank("hangs")[collective]
    assert f"openreg_gloo {NAMED[collective]}: " in outcome, outcome
    assert f"Timed out waiting {int(PG_TIMEOUT.total_seconds() * 1000)}ms" in outcome, outcome


def test_collectives_of_different_sizes_raise_on_every_rank_with_distributed_debug_detail(tmp_path):
    reports = run(tmp_path, "mismatch")
    for rank, report in enumerate(reports):
        for collective, op_type in (("all_reduce", "ALLREDUCE"), ("all_gather_into_tensor", "_ALLGATHER_BASE")):
            outcome = report.get(collective, "did not run")
            assert "Detected mismatch between collectives on ranks" in outcome, (rank, outcome)
            assert f"OpType={op_type}" in outcome and "Tensor shapes: " in outcome, (rank, outcome)
        assert report["all_reduce_after"] == "returned", report
        assert report["after"] == [2.0, 2.0, 2.0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one rank of tests/test_distributed_faults.py")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--scenario", choices=[*FAULTS, "mismatch"], required=True)
    parser.add_argument("--directory", type=Path, required=True)
    arguments = parser.parse_args()
    worker(arguments.rank, arguments.scenario, arguments.directory)
