"""Train a small CNN on synthetic data on openreg with mixed precision.

Shows the pieces a training loop on a new device needs, spelled the way they
are on CUDA: the model and data on the device, torch.autocast for the forward
pass, torch.amp.GradScaler around backward and the optimizer step, and a
checkpoint that holds the model, optimizer and scaler so training can resume.

    python examples/train_cnn.py                       # 200 steps, float16 autocast
    python examples/train_cnn.py --steps 50 --checkpoint /tmp/cnn.pt
    python examples/train_cnn.py --steps 100 --checkpoint /tmp/cnn.pt --resume
    python examples/train_cnn.py --device cpu --dtype bfloat16   # the same on CPU

The task is learnable on purpose: each class is a fixed random pattern plus
noise, so the loss must fall and accuracy rise well above chance (10%).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

CLASSES = 10


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = torch.nn.Linear(32 * 4 * 4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def synthetic_batches(device: torch.device, batch_size: int, seed: int = 0):
    """An endless stream of (images, labels): a fixed 16x16 pattern per class
    plus noise. `seed` picks the noise; the patterns (the task) never change."""
    patterns = torch.randn(CLASSES, 1, 16, 16, generator=torch.Generator().manual_seed(1234))
    generator = torch.Generator().manual_seed(seed)
    while True:
        labels = torch.randint(0, CLASSES, (batch_size,), generator=generator)
        images = patterns[labels] + 2.0 * torch.randn(batch_size, 1, 16, 16, generator=generator)
        if device.type != "cpu":
            # From pinned (page-locked) memory the copy is queued on the device's
            # stream and the loop goes on preparing the next step.
            images, labels = images.pin_memory(), labels.pin_memory()
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="openreg")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--checkpoint", help="save model, optimizer and scaler here at the end")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = SmallCNN().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # float16 gradients underflow without loss scaling; bfloat16 has float32's
    # range, so the scaler is only needed (and only enabled) for float16.
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    start_step = 0
    if args.resume:
        if not args.checkpoint or not os.path.exists(args.checkpoint):
            parser.error("--resume needs an existing --checkpoint file")
        # map_location: a checkpoint written on any device loads onto this one.
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        start_step = state["step"]

    batches = synthetic_batches(device, args.batch_size, seed=start_step)
    model.train()
    started = time.perf_counter()
    first_loss = loss_value = float("nan")
    for step in range(start_step, start_step + args.steps):
        images, labels = next(batches)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype):
            logits = model(images)  # convolutions and linear layers in `dtype`
            loss = F.cross_entropy(logits, labels)  # a float32 operator under autocast
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # skipped if the unscaled gradients hold inf/NaN
        scaler.update()
        if step == start_step or (step + 1) % 50 == 0 or step + 1 == start_step + args.steps:
            loss_value = loss.item()
            if step == start_step:
                first_loss = loss_value
            print(f"step {step + 1:4d}  loss {loss_value:.4f}  scale {scaler.get_scale():.0f}")
    elapsed = time.perf_counter() - started

    model.eval()
    images, labels = next(batches)
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    print(f"{args.steps} steps on {device} in {elapsed:.2f} s; accuracy {accuracy:.1%} on a fresh batch")

    if args.checkpoint:
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "step": start_step + args.steps,
            },
            args.checkpoint,
        )
        print(f"checkpoint written to {args.checkpoint}")
    return {"first_loss": first_loss, "last_loss": loss_value, "accuracy": accuracy}


if __name__ == "__main__":
    main()
