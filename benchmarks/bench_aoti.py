"""An AOTInductor package on openreg against the same package compiled for the CPU.

    python benchmarks/bench_aoti.py [--repeat N] [--batch B]

One model (an MLP block and a LayerNorm: generated C++ kernels, addmm extern kernels,
constants) is exported on each device and compiled with
torch._inductor.aoti_compile_and_package; both packages are loaded with
aoti_load_package. Calls alternate CPU and openreg (CPU, openreg, CPU, openreg, ...);
an openreg call is timed to its completion (torch.openreg.synchronize()). Reported:
the median time per call on each device and the ratio openreg / CPU (1.0 = as fast as
the CPU package).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch_openreg  # noqa: F401  (registers openreg when autoload is off)


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
    parser.add_argument("--repeat", type=int, default=200, help="timed calls per device")
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
        torch.openreg.synchronize()

    torch.testing.assert_close(on_openreg(x_openreg)[0].cpu(), on_cpu(x_cpu)[0], rtol=0, atol=0)
    times: dict[str, list[float]] = {"cpu": [], "openreg": []}
    for _ in range(10):  # warm-up: caches, constants copied to the device
        run_cpu()
        run_openreg()
    for _ in range(args.repeat):
        for name, run in (("cpu", run_cpu), ("openreg", run_openreg)):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    cpu_ms = statistics.median(times["cpu"]) * 1e3
    openreg_ms = statistics.median(times["openreg"]) * 1e3
    print(f"AOTInductor package, Block(width={args.width}), input {args.batch}x{args.width}, {args.repeat} calls each")
    print(f"  cpu      {cpu_ms:8.3f} ms")
    print(f"  openreg  {openreg_ms:8.3f} ms")
    print(f"  openreg / cpu = {openreg_ms / cpu_ms:.3f}")


if __name__ == "__main__":
    main()
