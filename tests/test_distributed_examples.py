"""The distributed examples as users launch them, with torchrun, against one process on the
whole batch: examples/ddp_train.py (DDP), examples/fsdp_tp_train.py (FSDP2 and tensor
parallelism on a device mesh) and two torchrun "nodes" meeting on loopback. Launched with
tests/test_distributed.py's bounded launcher; no process may outlive its launch."""

from __future__ import annotations

import importlib.util
import json
import math
import socket
import sys

import pytest
import torch
import torch.distributed as dist

from test_distributed import REPO, WORLD, Launch, launch

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds leftover processes in /proc"),
]


def assert_finished(result: Launch, processes: int) -> None:
    assert not result.timed_out and result.returncodes == [0] * processes, result.logs
    assert result.leftovers == [], f"processes left running: {result.leftovers}"


def load_example():
    spec = importlib.util.spec_from_file_location("ddp_train", REPO / "examples" / "ddp_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_torchrun_example_matches_one_process_on_the_whole_batch(tmp_path):
    steps = 5
    checkpoint = tmp_path / "final.pt"
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # the `torchrun` script, this Python
    result = launch(
        [torchrun + ["--standalone", "--nproc-per-node", str(WORLD), "examples/ddp_train.py",
                     "--steps", str(steps), "--save", str(checkpoint)]],
        tmp_path,
    )
    assert_finished(result, 1)
    trained = torch.load(checkpoint)

    example = load_example()
    model = example.make_model()
    optimizer = example.make_optimizer(model.parameters())
    for x, y in example.make_batches(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    for name, value in model.state_dict().items():
        assert trained[name].device.type == "cpu"
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6, msg=name)


def one_process_fsdp_tp_losses(steps: int) -> list[float]:
    """The oracle for examples/fsdp_tp_train.py: the same model and batches, one CPU
    process, no parallelism."""
    spec = importlib.util.spec_from_file_location("fsdp_tp_train", REPO / "examples" / "fsdp_tp_train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for tokens in example.make_batches(steps):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, example.VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


# ("dp", "tp"): tensor parallel only, FSDP only, both on four ranks (four devices each).
@pytest.mark.parametrize("mesh", ["1x2", "2x1", "2x2"])
def test_fsdp_tp_example_learns_as_one_process_on_the_whole_batch(tmp_path, mesh):
    steps = 10
    path = tmp_path / "losses.json"
    ranks = math.prod(int(n) for n in mesh.split("x"))
    result = launch(
        [["env", f"OPENREG_DEVICE_COUNT={max(ranks, 2)}", sys.executable, "-m", "torch.distributed.run",
          "--standalone", "--nproc-per-node", str(ranks),
          "examples/fsdp_tp_train.py", "--mesh", mesh, "--steps", str(steps), "--losses", str(path)]],
        tmp_path,
    )
    assert_finished(result, 1)
    losses = json.loads(path.read_text())
    assert losses[-1] < 0.5 * losses[0], losses
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(one_process_fsdp_tp_losses(steps)),
                               rtol=1e-4, atol=1e-5)


TWO_NODE_SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.openreg.set_device(local)
dist.init_process_group()
rank = dist.get_rank()
t = torch.full((4,), float(rank + 1), device=f"openreg:{local}")
dist.all_reduce(t)
report = {"world": dist.get_world_size(), "node": int(os.environ["GROUP_RANK"]), "group": dist.group.WORLD.name(),
          "device": str(t.device), "result": t.cpu().tolist()}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_on_loopback_all_reduce_on_openreg(tmp_path):
    # docs/integration/distributed.md's multi-node command, with both "nodes" on this host: two
    # torchrun launches meeting at a c10d rendezvous on 127.0.0.1.
    script = tmp_path / "all_reduce.py"
    script.write_text(TWO_NODE_SCRIPT)
    endpoint = f"127.0.0.1:{free_port()}"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", tmp_path.name,
                "--max-restarts", "0"]
    result = launch([torchrun + [str(script), str(tmp_path)] for _ in range(2)], tmp_path)
    assert_finished(result, 2)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert sorted(r["node"] for r in reports) == [0, 1]
    for r in reports:
        assert r["world"] == 2 and r["group"] == "openreg_gloo" and r["device"].startswith("openreg:")
        assert r["result"] == [3.0] * 4  # 1 + 2
