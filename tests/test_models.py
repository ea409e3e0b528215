"""Whole models on openreg equal the same models on CPU.

Six small random-init models (tests/model_zoo.py: GPT-2 with tied embeddings, Llama
with grouped-query attention and RoPE, BERT, T5, ViT, an LSTM+GRU language model),
each built once on CPU, deep-copied, and the copy moved with `.to("openreg")`. Every
phase a user runs (eval forward, an AdamW training step, greedy generation, a bf16
autocast forward, a torch.compile forward) runs on both, and openreg's results must
equal CPU's bit for bit, since openreg runs CPU's kernels on device memory. One
comparison takes a tolerance, explained where it is set: autocast, whose operator
policy differs by design. Each phase must also run no operator on the CPU fallback.

Each (model, phase) runs once per session; the equality test and the fallback test
of a phase read the same run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import model_zoo as zoo
from model_zoo import GENERATIVE, MODELS, PHASE_BY_NAME, PHASES

MODES = ("queue_all", "discrete")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"
NAMES = [m.name for m in MODELS]
TIED = [m.name for m in MODELS if m.tied]

# A cold compile of one of these models costs 30-50 s on a 2-core machine (Inductor
# compiles about ten C++ kernels per device; warm runs hit its on-disk caches), so by
# default the compiled forward is checked on three models covering three ways a graph
# reaches openreg: attention and tied embeddings (GPT-2), a convolution (ViT), a graph
# broken around nn.LSTM/GRU, which dynamo does not trace (torch._dynamo.config.allow_rnn).
# OPENREG_TEST_COMPILE_ALL=1 compiles all six; benchmarks/bench_models.py always does.
COMPILED = NAMES if os.environ.get("OPENREG_TEST_COMPILE_ALL") == "1" else ["gpt2", "vit", "rnn"]


@dataclass
class Run:
    """One phase of one model on both devices: what each returned (tensors by
    name), the operators the openreg side ran on the CPU fallback, and the
    exception, if either side raised."""

    cpu: dict[str, torch.Tensor] | None = None
    dev: dict[str, torch.Tensor] | None = None  # copied to CPU: no device memory held between tests
    not_on_device: tuple[str, ...] = ()  # openreg results that were not openreg tensors
    fallbacks: dict[str, int] | None = None
    error: BaseException | None = None

    def results(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        if self.error is not None:
            raise self.error
        assert not self.not_on_device, f"results not on {DEV}: {self.not_on_device}"
        return self.cpu, self.dev


def observe(phase: str, model: torch.nn.Module, result: Any) -> dict[str, torch.Tensor]:
    """What a phase's result is compared by: its output, and after a training step
    the loss, every gradient and every parameter, under all the names it has
    (a tied parameter under each of its names)."""
    if phase != "train_step":
        return {"output": result}
    observed = {"loss": result}
    for name, p in model.named_parameters(remove_duplicate=False):
        observed[f"grad {name}"] = p.grad
        observed[f"stepped {name}"] = p.detach()
    return observed


_RUNS: dict[tuple[str, str], Run] = {}


def run(model: str, phase: str) -> Run:
    key = (model, phase)
    if key not in _RUNS:
        _RUNS[key] = _run(zoo.BY_NAME[model], PHASE_BY_NAME[phase])
    return _RUNS[key]


def _run(spec: zoo.ModelSpec, phase: zoo.Phase) -> Run:
    result = Run()
    try:
        pair = zoo.Pair(spec, DEV)
        cpu_call, dev_call = pair.prepare(phase)
        result.cpu = observe(phase.name, pair.cpu, cpu_call())
        torch.openreg.reset_fallback_stats()
        try:
            dev_result = dev_call()
        finally:
            result.fallbacks = torch.openreg.fallback_stats()
        dev = observe(phase.name, pair.dev, dev_result)
        result.not_on_device = tuple(n for n, t in dev.items() if t is not None and t.device.type != DEV)
        result.dev = {n: None if t is None else t.cpu() for n, t in dev.items()}
        if phase.name == "autocast_bf16":
            # The float32 logits, which the test measures both bf16 results against.
            result.cpu["float32"] = zoo.forward(spec, pair.cpu, pair.cpu_batch)()
    except Exception as e:  # reported by every test that reads this run
        result.error = e
    finally:
        if phase.name == "compile":
            torch._dynamo.reset()
    return result


# The models whose openreg route runs kernels CPU has no counterpart of, so that
# CPU's results are not the exact target: none since nn.LSTM and nn.GRU take CPU's
# route (csrc/kernels/RNN.cpp). A model added here names its reason.
TOLERANCE: dict[str, dict[str, dict[str, float]]] = {}


def assert_matches_cpu(model: str, dev: dict[str, torch.Tensor], cpu: dict[str, torch.Tensor]) -> None:
    if model not in TOLERANCE:
        assert_bitwise_equal(dev, cpu)
        return
    assert dev.keys() == cpu.keys()
    for name, c in cpu.items():
        prefix = max((p for p in TOLERANCE[model] if name.startswith(p)), key=len)
        torch.testing.assert_close(dev[name], c, **TOLERANCE[model][prefix], msg=lambda m: f"{name}: {m}")


def assert_bitwise_equal(dev: dict[str, torch.Tensor], cpu: dict[str, torch.Tensor]) -> None:
    """Every tensor equal in dtype, shape and bits; names all mismatches."""
    assert dev.keys() == cpu.keys()
    wrong = []
    for name, c in cpu.items():
        d = dev[name]
        if c is None or d is None:
            if (c is None) != (d is None):
                wrong.append(f"{name}: None on {'CPU' if c is None else 'openreg'} only")
            continue
        if d.dtype != c.dtype or d.shape != c.shape:
            wrong.append(f"{name}: {d.dtype}{list(d.shape)} on openreg, {c.dtype}{list(c.shape)} on CPU")
        elif not torch.equal(d, c):
            diff = (d.double() - c.double()).abs()
            wrong.append(f"{name}: {int((diff > 0).sum())} of {c.numel()} elements differ, "
                         f"by at most {diff.max().item():.3g}")
    assert not wrong, f"{len(wrong)} of {len(cpu)} differ from CPU:\n" + "\n".join(wrong[:12])


@pytest.mark.parametrize("model", TIED)
def test_tied_parameters_stay_tied_after_to(model):
    # Module.to() keeps a Parameter object when the device copy's TensorImpl can be
    # swapped in (torch._has_compatible_shallow_copy_type, torch/nn/modules/module.py
    # _apply); otherwise it makes a new Parameter per module, and the modules that
    # shared one weight stop sharing it.
    pair = zoo.Pair(zoo.BY_NAME[model], DEV)
    cpu_groups = zoo.tied_groups(pair.cpu)
    assert cpu_groups, f"{model}'s CPU model ties no parameters; ModelSpec.tied says it should"
    assert zoo.tied_groups(pair.dev) == cpu_groups
    assert all(p.device.type == DEV for p in pair.dev.parameters())


@pytest.mark.parametrize("model", NAMES)
def test_forward_in_eval_mode_equals_cpu_bitwise(model):
    cpu, dev = run(model, "forward").results()
    assert_matches_cpu(model, dev, cpu)


@pytest.mark.parametrize("model", NAMES)
def test_adamw_training_step_gives_cpus_loss_gradients_and_parameters(model):
    cpu, dev = run(model, "train_step").results()
    assert_matches_cpu(model, dev, cpu)


@pytest.mark.parametrize("model", GENERATIVE)
def test_greedy_generation_gives_cpus_tokens(model):
    cpu, dev = run(model, "generate").results()
    assert cpu["output"].shape == (zoo.BATCH, zoo.BY_NAME[model].generated_length)
    assert_bitwise_equal(dev, cpu)


@pytest.mark.parametrize("model", NAMES)
def test_autocast_bf16_forward_is_as_close_to_float32_as_cpus(model):
    # Not bitwise: autocast("openreg") applies CUDA's operator policy (layer_norm,
    # softmax, pow, ... in float32), autocast("cpu") CPU's, which runs those in
    # bfloat16; the two cast different operators. Both must give bfloat16 logits
    # (the last linear layer ran in bfloat16), and openreg's must be as close to
    # the float32 logits as CPU's are, within a factor of 2 (measured: 0.9-1.2).
    cpu, dev = run(model, "autocast_bf16").results()
    reference = cpu["float32"]
    assert dev["output"].dtype == cpu["output"].dtype == torch.bfloat16
    cpu_error = (cpu["output"].float() - reference).abs().max().item()
    dev_error = (dev["output"].float() - reference).abs().max().item()
    assert 0 < cpu_error and dev_error <= 2 * cpu_error, (dev_error, cpu_error)


@pytest.mark.parametrize("model", COMPILED)
def test_compiled_forward_equals_compiled_cpu_bitwise(model):
    # Inductor generates the same C++ kernels for openreg as for the CPU
    # (docs/integration/compiler.md), so compiled against compiled is exact.
    cpu, dev = run(model, "compile").results()
    assert_matches_cpu(model, dev, cpu)


@pytest.mark.parametrize(
    "model, phase",
    [(m.name, p.name) for m in MODELS for p in PHASES
     if p.applies_to(m) and (p.name != "compile" or m.name in COMPILED)],
)
def test_no_operator_runs_on_the_cpu_fallback(model, phase):
    result = run(model, phase)
    if result.fallbacks:
        assert result.fallbacks == {}
    result.results()  # a phase that raised has not shown that it needs no fallback
