"""Small random-init models and the phases a user runs them through.

Shared by tests/test_models.py (openreg against CPU, value by value) and
benchmarks/bench_models.py (openreg's time over CPU's). Every model is built from
a config, on CPU, from a fixed seed: nothing is downloaded. The sizes (vocabulary
1000, width 128, 2 layers, batches of 2 x 32 tokens or 2 images of 32 x 32) keep
one phase of one model at a few milliseconds, so that what differs between the
devices is the route each operator takes, not the arithmetic's size.

Dropout is 0 everywhere: each device draws from its own generator, and what is
compared is the models' arithmetic.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import transformers
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

transformers.logging.set_verbosity_error()

VOCAB, WIDTH, LAYERS, HEADS, FFN = 1000, 128, 2, 4, 256
BATCH, TOKENS, PROMPT, NEW_TOKENS = 2, 32, 16, 8
PAD, BOS, EOS = 0, 1, 2

Batch = dict[str, torch.Tensor]


class RecurrentLM(nn.Module):
    """A word-level language model of the kind transformers has no class for: an
    LSTM layer, then a GRU layer, and an output layer tied to the embedding
    (Press & Wolf, 2017). Both recurrent layers reach their fused cells on an
    accelerator (aten/src/ATen/native/RNN.cpp: `_thnn_fused_lstm_cell`,
    `_thnn_fused_gru_cell` when the input is not on the CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.lstm = nn.LSTM(WIDTH, WIDTH, batch_first=True)
        self.gru = nn.GRU(WIDTH, WIDTH, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def step(self, input_ids: torch.Tensor, state: tuple | None = None) -> tuple[torch.Tensor, tuple]:
        lstm_state, gru_state = state or (None, None)
        x, lstm_state = self.lstm(self.embed(input_ids), lstm_state)
        x, gru_state = self.gru(x, gru_state)
        return self.head(x), (lstm_state, gru_state)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> CausalLMOutput:
        logits, _ = self.step(input_ids)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutput(loss=loss, logits=logits)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding, carrying the recurrent state from token to token."""
        logits, state = self.step(input_ids)
        tokens = [input_ids]
        for _ in range(max_new_tokens):
            token = logits[:, -1:].argmax(-1)
            tokens.append(token)
            logits, state = self.step(token, state)
        return torch.cat(tokens, 1)


def tokens(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Ids from 3 on: no padding, beginning or end of sequence inside the text.
    return torch.randint(3, VOCAB, shape, generator=generator)


def causal_lm_batch() -> Batch:
    input_ids = tokens(BATCH, TOKENS, seed=1)
    return {"input_ids": input_ids, "labels": input_ids}


def masked_lm_batch() -> Batch:
    """BERT's masked-LM batch: the second sequence padded over its last 8 tokens
    (the attention mask hides them), labels on 1 position in 4, -100 (ignored) elsewhere."""
    input_ids = tokens(BATCH, TOKENS, seed=1)
    attention_mask = torch.ones(BATCH, TOKENS, dtype=torch.long)
    attention_mask[1, -8:] = 0
    input_ids[1, -8:] = PAD
    labels = torch.full_like(input_ids, -100)
    labels[:, ::4] = tokens(BATCH, TOKENS // 4, seed=2)
    labels[1, -8:] = -100
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, TOKENS // 2:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
            "labels": labels}


def seq2seq_batch() -> Batch:
    """T5: the encoder reads 32 tokens, the decoder is taught 16 (its input is the
    labels shifted right behind the start token, PAD)."""
    labels = tokens(BATCH, TOKENS // 2, seed=2)
    decoder_input_ids = torch.cat([torch.full((BATCH, 1), PAD), labels[:, :-1]], 1)
    return {"input_ids": tokens(BATCH, TOKENS, seed=1), "decoder_input_ids": decoder_input_ids, "labels": labels}


def image_batch() -> Batch:
    generator = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=generator),
            "labels": torch.randint(0, 10, (BATCH,), generator=generator)}


def hf_generate(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Greedy decoding of NEW_TOKENS tokens after the batch's prompt. The end-of-
    sequence id is set, so transformers' stopping criterion (`torch.isin`) runs."""
    if model.config.is_encoder_decoder:
        prompt = {"input_ids": batch["input_ids"]}
    else:
        prompt = {"input_ids": batch["input_ids"][:, :PROMPT]}
    prompt["attention_mask"] = torch.ones_like(prompt["input_ids"])
    return model.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)


def rnn_generate(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model.generate(batch["input_ids"][:, :PROMPT], NEW_TOKENS)


def hf(config_class: Any, model_class: Any, **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        # Eager attention would be the same on both devices by construction;
        # SDPA is what models use by default and what backends must match.
        options = {"pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS, **config}
        return model_class(config_class(**options, attn_implementation="sdpa"))
    return build


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[], nn.Module]  # the CPU model, random init (seeded by make())
    batch: Callable[[], Batch]  # forward inputs, plus the training step's "labels"
    generate: Callable[[nn.Module, Batch], torch.Tensor] | None = None  # greedy; None: not generative
    tied: bool = False  # some parameters are shared by two modules
    encoder_decoder: bool = False  # generate returns the decoder's tokens only
    notes: str = ""

    @property
    def generated_length(self) -> int:
        """Tokens in generate's output: the prompt and the new ones, or for an
        encoder-decoder the decoder's start token and the new ones."""
        return NEW_TOKENS + (1 if self.encoder_decoder else PROMPT)

    def make(self) -> nn.Module:
        torch.manual_seed(0)
        return self.build()


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        "gpt2",
        hf(transformers.GPT2Config, transformers.GPT2LMHeadModel, vocab_size=VOCAB, n_embd=WIDTH,
           n_layer=LAYERS, n_head=HEADS, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
        causal_lm_batch, hf_generate, tied=True,
        notes="decoder, learned positions, LM head tied to the token embedding",
    ),
    ModelSpec(
        "llama",
        hf(transformers.LlamaConfig, transformers.LlamaForCausalLM, vocab_size=VOCAB, hidden_size=WIDTH,
           intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
           max_position_embeddings=64),
        causal_lm_batch, hf_generate,
        notes="decoder, grouped-query attention (4 query heads, 2 key/value heads), RoPE, RMSNorm, SwiGLU",
    ),
    ModelSpec(
        "bert",
        hf(transformers.BertConfig, transformers.BertForMaskedLM, vocab_size=VOCAB, hidden_size=WIDTH,
           num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
           max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
        masked_lm_batch, tied=True,
        notes="encoder, padding mask, token types, masked-LM head tied to the embedding",
    ),
    ModelSpec(
        "t5",
        hf(transformers.T5Config, transformers.T5ForConditionalGeneration, vocab_size=VOCAB, d_model=WIDTH,
           d_kv=WIDTH // HEADS, d_ff=FFN, num_layers=LAYERS, num_heads=HEADS, dropout_rate=0.0,
           decoder_start_token_id=PAD),
        seq2seq_batch, hf_generate, tied=True, encoder_decoder=True,
        notes="encoder-decoder, relative position buckets, cross-attention, embeddings shared by both and the LM head",
    ),
    ModelSpec(
        "vit",
        hf(transformers.ViTConfig, transformers.ViTForImageClassification, image_size=32, patch_size=8,
           hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=10),
        image_batch,
        notes="vision transformer: convolutional patch embedding, class token, classifier",
    ),
    ModelSpec("rnn", RecurrentLM, causal_lm_batch, rnn_generate, tied=True,
              notes="LSTM then GRU language model, output layer tied to the embedding"),
)
BY_NAME = {m.name: m for m in MODELS}
GENERATIVE = tuple(m.name for m in MODELS if m.generate is not None)


def to_device(batch: Batch, device: str) -> Batch:
    return {k: v.to(device) for k, v in batch.items()}


def forward_inputs(batch: Batch) -> Batch:
    return {k: v for k, v in batch.items() if k != "labels"}


def tied_groups(model: nn.Module) -> list[list[str]]:
    """The names under which one Parameter object is registered, for every
    Parameter registered under more than one name."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return sorted(group for group in names.values() if len(group) > 1)


# Phases. Each takes the model (already on its device) and the batch (on the
# same device) and returns a call that runs the phase once and returns what to
# compare: the benchmark times the call, the tests compare its result.

def forward(spec: ModelSpec, model: nn.Module, batch: Batch) -> Callable[[], Any]:
    model.eval()
    inputs = forward_inputs(batch)

    def run() -> torch.Tensor:
        with torch.no_grad():
            return model(**inputs).logits
    return run


def train_step(spec: ModelSpec, model: nn.Module, batch: Batch) -> Callable[[], Any]:
    """zero_grad, forward with the loss, backward, AdamW step. foreach=True on both
    devices: torch's default is foreach on accelerators and the for-loop on CPU
    (torch/optim/optimizer.py, _default_to_fused_or_foreach), two orders of the
    same arithmetic; the test compares one implementation on two devices."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, foreach=True)

    def run() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        return loss.detach()
    return run


def generate(spec: ModelSpec, model: nn.Module, batch: Batch) -> Callable[[], Any]:
    if spec.generate is None:
        raise ValueError(f"{spec.name} is not generative; the generate phase is for {', '.join(GENERATIVE)}")
    model.eval()
    return lambda: spec.generate(model, batch)


@functools.cache
def cpu_onednn_runs_bf16_lstm() -> bool:
    """Whether CPU's LSTM runs under bf16 autocast on this machine. CPU sends it to
    oneDNN, whose bf16 LSTM primitive needs AVX-512 (on an AVX2-only CPU it raises
    "could not create a primitive descriptor for the LSTM forward propagation
    primitive")."""
    lstm = nn.LSTM(4, 4)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            lstm(torch.randn(2, 1, 4))
    except RuntimeError as e:
        if "could not create a primitive descriptor" not in str(e):
            raise
        return False
    return True


def autocast_bf16(spec: ModelSpec, model: nn.Module, batch: Batch) -> Callable[[], Any]:
    model.eval()
    inputs = forward_inputs(batch)
    device_type = next(iter(inputs.values())).device.type
    # Where oneDNN cannot run CPU's bf16 LSTM, CPU's run takes its kernels
    # without oneDNN, as on a build without it.
    cpu_without_onednn = device_type == "cpu" and spec.name == "rnn" and not cpu_onednn_runs_bf16_lstm()

    def run() -> torch.Tensor:
        kernels = torch.backends.mkldnn.flags(enabled=False) if cpu_without_onednn else contextlib.nullcontext()
        with torch.no_grad(), torch.autocast(device_type, dtype=torch.bfloat16), kernels:
            return model(**inputs).logits
    return run


def compiled_forward(spec: ModelSpec, model: nn.Module, batch: Batch) -> Callable[[], Any]:
    """torch.compile with the default backend (Inductor); the first call compiles."""
    model.eval()
    compiled = torch.compile(model)
    inputs = forward_inputs(batch)

    def run() -> torch.Tensor:
        with torch.no_grad():
            return compiled(**inputs).logits
    return run


@dataclass(frozen=True)
class Phase:
    name: str
    prepare: Callable[[ModelSpec, nn.Module, Batch], Callable[[], Any]]
    generative_only: bool = False

    def applies_to(self, spec: ModelSpec) -> bool:
        return spec.generate is not None or not self.generative_only


PHASES: tuple[Phase, ...] = (
    Phase("forward", forward),
    Phase("train_step", train_step),
    Phase("generate", generate, generative_only=True),
    Phase("autocast_bf16", autocast_bf16),
    Phase("compile", compiled_forward),
)
PHASE_BY_NAME = {p.name: p for p in PHASES}


@dataclass
class Pair:
    """The same model (same init) on CPU and on openreg: built on CPU, deep-copied,
    the copy moved with .to(device)."""

    spec: ModelSpec
    device: str = "openreg"
    cpu: nn.Module = field(init=False)
    dev: nn.Module = field(init=False)
    cpu_batch: Batch = field(init=False)
    dev_batch: Batch = field(init=False)

    def __post_init__(self) -> None:
        self.cpu = self.spec.make()
        self.dev = copy.deepcopy(self.cpu).to(self.device)
        self.cpu_batch = self.spec.batch()
        self.dev_batch = to_device(self.cpu_batch, self.device)

    def prepare(self, phase: Phase) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """The phase's call on CPU and on the device."""
        return (phase.prepare(self.spec, self.cpu, self.cpu_batch),
                phase.prepare(self.spec, self.dev, self.dev_batch))
