"""A small transformer trained with FSDP2 and tensor parallelism on openreg devices:

    torchrun --standalone --nproc-per-node 2 examples/fsdp_tp_train.py --mesh 1x2
    torchrun --standalone --nproc-per-node 2 examples/fsdp_tp_train.py --mesh 2x1
    OPENREG_DEVICE_COUNT=4 torchrun --standalone --nproc-per-node 4 examples/fsdp_tp_train.py --mesh 2x2

The processes form a 2-D device mesh ("dp", "tp"): within a "tp" row each attention and
MLP layer is split over the ranks (``parallelize_module``: query/key/value and the MLP's
first linear by columns, the output projections by rows), and over the "dp" dimension
every block is ``fully_shard``-ed (FSDP2), each "dp" rank training on its share of every
batch. The model learns to predict the next token of a repeating sequence; rank 0 prints
the loss. ``--device cpu`` runs the same on CPU tensors over gloo, for comparison;
``--losses PATH`` writes rank 0's losses to PATH (JSON).
"""

from __future__ import annotations

import argparse
import json
import os

import torch  # loads torch_openreg through the torch.backends entry point
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

SEED = 0
VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 32, 64, 4, 2, 16, 8


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(DIM, DIM) for _ in range(4))
        self.up, self.down = torch.nn.Linear(DIM, 4 * DIM), torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        # -1 heads: under tensor parallelism each rank holds HEADS / tp of them.
        q, k, v = (f(h).view(b, t, -1, DIM // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Transformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.position = torch.nn.Parameter(torch.zeros(SEQ, DIM))
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_model() -> Transformer:
    """The same initial weights in every process: parallelize_module and fully_shard
    shard each rank's copy of the whole tensors."""
    torch.manual_seed(SEED)
    return Transformer()


def make_batches(steps: int) -> list[torch.Tensor]:
    """``steps`` global batches of SEQ + 1 tokens: windows of a repeating sequence."""
    g = torch.Generator().manual_seed(SEED + 1)
    pattern = torch.randint(0, VOCAB, (11,), generator=g)
    stream = pattern.repeat(64)
    batches = []
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - SEQ - 1, (BATCH,), generator=g)
        batches.append(torch.stack([stream[s: s + SEQ + 1] for s in starts]))
    return batches


def parallelize(model: Transformer, mesh) -> Transformer:
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {
            "q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "up": ColwiseParallel(), "down": RowwiseParallel(),
        })
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--mesh", default="1x2", help="DPxTP, their product the number of processes")
    parser.add_argument("--device", default="openreg", choices=["openreg", "cpu"])
    parser.add_argument("--losses", help="write rank 0's losses here (JSON)")
    args = parser.parse_args(argv)

    local_rank = int(os.environ["LOCAL_RANK"])  # torchrun sets it, RANK, WORLD_SIZE, MASTER_*
    if args.device == "openreg":
        device = torch.device("openreg", local_rank)
        torch.openreg.set_device(device)
        dist.init_process_group()  # openreg's default backend: openreg_gloo
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    dp, tp = (int(n) for n in args.mesh.split("x"))
    if dp * tp != dist.get_world_size():
        raise SystemExit(f"--mesh {args.mesh} needs {dp * tp} processes, not {dist.get_world_size()}")
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    model = parallelize(make_model().to(device), mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    dp_rank = mesh["dp"].get_local_rank()
    losses = []
    for step, batch in enumerate(make_batches(args.steps)):
        # This dp rank's share of the batch; the tp ranks of a row see the same one.
        tokens = batch.chunk(dp)[dp_rank].to(device)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        # The mean over the dp ranks: the loss on the whole batch.
        total = loss.detach().clone()
        dist.all_reduce(total, group=mesh["dp"].get_group())
        losses.append(total.item() / dp)
        if dist.get_rank() == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {losses[-1]:.4f}", flush=True)
    if dist.get_rank() == 0 and args.losses:
        with open(args.losses, "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()
    return losses


if __name__ == "__main__":
    main()
