"""The examples run as documented and actually learn."""

import importlib.util
import os

import torch

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_cnn_learns_with_autocast_and_grad_scaler_and_resumes(tmp_path):
    train_cnn = load_example("train_cnn")
    checkpoint = str(tmp_path / "cnn.pt")
    first = train_cnn.main(["--steps", "60", "--batch-size", "32", "--checkpoint", checkpoint])
    assert first["last_loss"] < 0.5 * first["first_loss"]
    assert first["accuracy"] > 0.5  # chance is 0.1
    state = torch.load(checkpoint)
    assert state["step"] == 60
    assert state["model"]["classifier.weight"].device.type == "openreg"
    assert state["scaler"]["scale"] > 0
    resumed = train_cnn.main(["--steps", "10", "--batch-size", "32", "--checkpoint", checkpoint, "--resume"])
    # Resuming continues from the trained model rather than starting over.
    assert resumed["first_loss"] < 0.5 * first["first_loss"]
    assert torch.load(checkpoint)["step"] == 70


def test_train_cnn_in_bfloat16_runs_without_a_scaler():
    train_cnn = load_example("train_cnn")
    result = train_cnn.main(["--steps", "30", "--batch-size", "32", "--dtype", "bfloat16"])
    assert result["last_loss"] < result["first_loss"]


def test_generate_learns_the_sentence_and_writes_cpus_tokens():
    generate = load_example("generate")
    result = generate.main([])
    assert result["last_loss"] < 0.05 * result["first_loss"]
    assert result["completion"] == " brown fox jumps over the lazy dog."
    assert result["matches_cpu"]
    assert result["fallbacks"] == {}
