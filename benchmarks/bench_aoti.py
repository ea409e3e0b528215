"""An AOTInductor package on openreg against the same package compiled for the CPU.

    python benchmarks/bench_aoti.py [--repeat N] [--batch B] [--width W] [--batch-ms MS]

One model (an MLP block and a LayerNorm: generated C++ kernels, addmm extern kernels,
constants) is exported on each device and compiled with
torch._inductor.aoti_compile_and_package; both packages are loaded with
aoti_load_package. Timed as bench_ops and bench_models time: pairs of batches of about
20 ms of CPU time, alternating which device goes first, openreg's batch timed to its
completion (torch.openreg.synchronize() after its last call); ratio = median of the
pairs' ratios, with quartiles (1.0 = as fast as the CPU package). A second line
synchronises after every openreg call (no call overlaps the next one's launch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch
import torch_openreg  # noqa: F401  (registers openreg when autoload is off)

from bench_ops import alternating_pairs, calls_per_batch, pair_ratios, per_call, quartiles


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def package(model: torch.nn.Module, x: torch.Tensor, directory: str) -> object:
    device = x.device.type
    with torch.no_grad():
        exported = torch.export.export(model.to(device), (x,))
        path = torch._inductor.aoti_compile_and_package(
            exported, package_path=os.path.join(directory, f"block_{device}.pt2")
        )
    return torch._inductor.aoti_load_package(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=21, help="pairs of timed batches")
    parser.add_argument("--batch-ms", type=float, default=20.0, help="CPU time of one batch")
    parser.add_argument("--batch", type=int, default=64, help="rows of the input")
    parser.add_argument("--width", type=int, default=256, help="model width")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Block(args.width).eval()
    x_cpu = torch.randn(args.batch, args.width)
    x_openreg = x_cpu.to("openreg")
    with tempfile.TemporaryDirectory() as directory:
        on_cpu = package(model, x_cpu, directory)
        on_openreg = package(model, x_openreg, directory)

    def run_cpu() -> None:
        on_cpu(x_cpu)

    def run_openreg() -> None:
        on_openreg(x_openreg)

    def run_openreg_synchronised() -> None:
        on_openreg(x_openreg)
        torch.openreg.synchronize()

    torch.testing.assert_close(on_openreg(x_openreg)[0].cpu(), on_cpu(x_cpu)[0], rtol=0, atol=0)
    for _ in range(10):  # warm-up: caches, constants copied to the device
        run_cpu()
        run_openreg_synchronised()
    calls = calls_per_batch(run_cpu, args.batch_ms)
    print(f"AOTInductor package, Block(width={args.width}), input {args.batch}x{args.width}; "
          f"{args.repeat} pairs of batches of {calls} calls, ratio = openreg / CPU")
    for label, run in (("batch, synchronised at its end", run_openreg),
                       ("every call synchronised", run_openreg_synchronised)):
        cpu_t, dev_t = alternating_pairs(lambda _: per_call(run_cpu, calls), lambda _: per_call(run, calls),
                                         args.repeat)
        ratios = pair_ratios(cpu_t, dev_t)
        q1, q3 = quartiles(ratios)
        print(f"  {label:<32} cpu {statistics.median(cpu_t) * 1e3:7.3f} ms  openreg "
              f"{statistics.median(dev_t) * 1e3:7.3f} ms  ratio {statistics.median(ratios):.3f} "
              f"({q1:.3f}-{q3:.3f})")


if __name__ == "__main__":
    main()
