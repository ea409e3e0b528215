"""Peak resident memory of a model test process on CPU and on openreg.

    python benchmarks/bench_memory.py [--widths 256,512,768] [--rounds 2] [--json FILE]

A test file builds models of several sizes one after another, runs them and
drops them. This runs that pattern (GPT-2 configs from transformers, random
init: per width a forward, two AdamW training steps and a greedy generation)
once in a fresh process per device and prints each process's peak resident set
size (ru_maxrss) and the ratio openreg / CPU. On openreg device memory is the
process's memory, so the caching allocator's free blocks count unless they
give their pages back (release_threshold_mb, docs/integration/allocator.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKLOAD = r"""
import gc, json, resource, sys
import torch, transformers
device, widths, rounds = sys.argv[1], [int(w) for w in sys.argv[2].split(",")], int(sys.argv[3])
torch.manual_seed(0)
peak_reserved = 0
for _ in range(rounds):
    for width in widths:
        config = transformers.GPT2Config(vocab_size=4096, n_embd=width, n_layer=4, n_head=8, n_positions=256)
        model = transformers.GPT2LMHeadModel(config).to(device)
        tokens = torch.randint(0, 4096, (8, 128), device=device)
        with torch.no_grad():
            model(tokens).logits.sum().item()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            model(tokens, labels=tokens).loss.backward()
            optimizer.step()
        model.generate(tokens[:2, :16], max_new_tokens=16, do_sample=False, pad_token_id=0)
        if device == "openreg":
            torch.openreg.synchronize()
            peak_reserved = max(peak_reserved, torch.openreg.max_memory_reserved())
        del model, optimizer, tokens
        gc.collect()
print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "peak_reserved": peak_reserved}))
"""


def run(device: str, widths: str, rounds: int) -> dict:
    done = subprocess.run([sys.executable, "-c", WORKLOAD, device, widths, str(rounds)],
                          capture_output=True, text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    if done.returncode != 0:
        raise SystemExit(f"{device} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="256,512,768", help="GPT-2 widths, built in this order each round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    cpu = run("cpu", args.widths, args.rounds)
    dev = run("openreg", args.widths, args.rounds)
    ratio = dev["peak_rss_mb"] / cpu["peak_rss_mb"]
    print(f"peak resident memory: cpu {cpu['peak_rss_mb']:.0f} MB, openreg {dev['peak_rss_mb']:.0f} MB "
          f"(ratio {ratio:.2f}; goal <= 1.05); openreg's peak reserved {dev['peak_reserved'] / 2**20:.0f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "openreg": dev, "ratio": ratio, "widths": args.widths, "rounds": args.rounds}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
