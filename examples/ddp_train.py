"""DistributedDataParallel on openreg devices, one process per device:

    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py

Each process trains the same small regression model on ``openreg:<local rank>``, on its
shard of every batch; DDP averages the gradients over the processes with the
``openreg_gloo`` c10d backend, which ``init_process_group()`` picks for openreg on its
own (docs/integration/distributed.md). At the end every rank checks that its weights equal rank 0's.
``--save PATH`` writes rank 0's final state dict (CPU tensors) to PATH.
"""

from __future__ import annotations

import argparse
import os

import torch  # loads torch_openreg through the torch.backends entry point
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SEED = 0
BATCH = 32  # the global batch, split evenly over the processes


def make_model() -> torch.nn.Module:
    """The same initial weights in every process (DDP would broadcast rank 0's anyway)."""
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def make_batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` global batches of a noisy linear target, on the CPU, the same everywhere."""
    g = torch.Generator().manual_seed(SEED + 1)
    w = torch.randn(16, 1, generator=g)
    batches = []
    for _ in range(steps):
        x = torch.randn(BATCH, 16, generator=g)
        batches.append((x, x @ w + 0.01 * torch.randn(BATCH, 1, generator=g)))
    return batches


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--save", help="write rank 0's final state dict here")
    args = parser.parse_args()

    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("openreg", local_rank)
    torch.openreg.set_device(device)
    dist.init_process_group()  # openreg's default backend: openreg_gloo
    rank, world = dist.get_rank(), dist.get_world_size()
    if BATCH % world:
        raise SystemExit(f"the batch of {BATCH} does not split evenly over {world} processes")

    model = DDP(make_model().to(device), device_ids=[local_rank])
    optimizer = make_optimizer(model.parameters())
    for step, (x, y) in enumerate(make_batches(args.steps)):
        # This rank's shard; DDP averages the gradients, so the step equals one on the
        # whole batch with the mean loss.
        x, y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.5f}  (rank 0's shard)", flush=True)

    # DDP keeps the replicas identical; check it with a collective on the device.
    flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    if not torch.equal(flat, reference):
        raise SystemExit(f"rank {rank}: weights differ from rank 0's after {args.steps} steps")
    if rank == 0:
        print(f"weights identical on {world} ranks ({flat.numel()} parameters on openreg)")
        if args.save:
            torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
