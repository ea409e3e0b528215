"""Teach a small Llama-style language model a sentence on openreg, then let it write.

Nothing is downloaded: the model is built from a transformers config with random
weights, its vocabulary is the sentence's characters. A short AdamW training run
on the device teaches it the sentence; then `model.generate` (greedy) completes a
prompt on openreg, and the same weights copied to the CPU must write the same tokens.

    python examples/generate.py                          # 150 steps, prompt "the quick"
    python examples/generate.py --prompt "over" --steps 300
    python examples/generate.py --steps 0                # untrained: random characters
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import transformers

TEXT = "the quick brown fox jumps over the lazy dog. "


class CharTokenizer:
    """One token per character of TEXT; the full stop ends a sentence (end-of-sequence)."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.ids = {c: i for i, c in enumerate(self.chars)}
        self.eos_token_id = self.ids["."]

    def encode(self, text: str) -> torch.Tensor:
        unknown = sorted(set(text) - set(self.ids))
        if unknown:
            raise SystemExit(f"the prompt may only use the characters of {TEXT!r}, not {unknown}")
        return torch.tensor([[self.ids[c] for c in text]])

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())


def build_model(vocab_size: int, eos_token_id: int) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=eos_token_id,
    )
    return transformers.LlamaForCausalLM(config)


def train(model: torch.nn.Module, tokens: torch.Tensor, steps: int, device: torch.device) -> list[float]:
    """AdamW on random 32-character windows of the repeated sentence."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, tokens.numel() - 33, (16,), generator=generator)
        batch = torch.stack([tokens[s:s + 33] for s in starts.tolist()]).to(device)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def greedy(model: torch.nn.Module, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    model.eval()
    attention_mask = torch.ones_like(prompt)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=attention_mask, do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, prompt.shape[1]:]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="openreg")
    parser.add_argument("--steps", type=int, default=150, help="training steps before generating (0: untrained)")
    parser.add_argument("--prompt", default="the quick")
    parser.add_argument("--max-new-tokens", type=int, default=60)
    args = parser.parse_args(argv)
    transformers.logging.set_verbosity_error()

    device = torch.device(args.device)
    if device.type == "openreg":
        torch.openreg.reset_fallback_stats()
    tokenizer = CharTokenizer(TEXT)
    torch.manual_seed(0)
    model = build_model(len(tokenizer.chars), tokenizer.eos_token_id).to(device)
    print(f"Llama-style model, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"random init, on {device}")

    start = time.perf_counter()
    losses = train(model, tokenizer.encode(TEXT * 20)[0], args.steps, device)
    if losses:
        print(f"trained {args.steps} steps in {time.perf_counter() - start:.1f} s: "
              f"loss {losses[0]:.2f} -> {losses[-1]:.3f}")

    prompt = tokenizer.encode(args.prompt)
    new = greedy(model, prompt.to(device), args.max_new_tokens)
    # The same weights on the CPU: openreg runs CPU's kernels, so the greedy
    # choices, and hence the tokens, must be CPU's.
    cpu_new = greedy(copy.deepcopy(model).to("cpu"), prompt, args.max_new_tokens)
    completion = tokenizer.decode(new.cpu())
    matches = torch.equal(new.cpu(), cpu_new)
    print(f"prompt:     {args.prompt!r}")
    print(f"completion: {completion!r}")
    print(f"same {new.numel()} tokens as on the CPU: {'yes' if matches else 'NO: ' + repr(tokenizer.decode(cpu_new))}")
    fallbacks = torch.openreg.fallback_stats() if device.type == "openreg" else {}
    if device.type == "openreg":
        print(f"operators run on openreg's CPU fallback: {', '.join(fallbacks) or 'none'}")
    return {"first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "completion": completion, "tokens": new.cpu().tolist(), "matches_cpu": matches,
            "fallbacks": fallbacks}


if __name__ == "__main__":
    result = main()
    raise SystemExit(0 if result["matches_cpu"] else 1)
