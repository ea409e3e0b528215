"""PyTorch's ModuleInfo database on openreg: every sample of every nn module,
run on CPU and on openreg, must give the same result.

One test per ModuleInfo of ``module_db``, and of one module of this file whose
parameter is shared by two submodules (torch's device-generic test machinery
instantiates them for openreg through PrivateUse1TestBase, as
tests/test_opinfo.py does for OpInfo), in float32. The samples come from ``module_info.module_inputs_func``,
built on the CPU; as in torch's ``TestModule.test_cpu_gpu_parity``, the module
is constructed on the CPU from the same seed for both devices and moved with
``Module.to``, lazy modules are initialised by a first forward on each device,
the CPU module's parameters and buffers are copied into the device module, and
the inputs are copied to the device (fresh leaves on both devices, tensors
passed twice stay one tensor). Each sample runs these ways:

- ``eval``: the samples for ``training=False``, forward in eval mode under
  ``torch.no_grad()`` (the inference paths: fused transformer and attention
  kernels);
- ``train``: the samples for ``training=True``, forward in training mode (the
  RNG seeded the same way on both devices, so dropout draws the same mask) and
  backward with the same random output gradients: outputs, gradients of the
  inputs and of the parameters, and the buffers (running statistics) are
  compared;
- ``to``: ``Module.to("openreg")`` on the CPU module keeps it: the same
  Parameter objects under the same names (so tied parameters stay tied and
  ``parameters()`` counts the same), every parameter and buffer on the device
  with its value;
- ``state_dict``: the device module's ``state_dict()`` loaded into a CPU module
  built from another seed, and that module's state loaded back into another
  device module, gives the same tensors, each on its module's device;
- ``error``: ``module_error_inputs_func``'s samples (arguments the module
  rejects) raise CPU's exception type on openreg too;
- ``channels_last``: ``train`` with the 4-d (5-d) input tensors and parameters
  in ``torch.channels_last`` (``channels_last_3d``), as torch's
  ``TestModule.test_memory_format``, for samples that have such inputs;
- ``noncontiguous``: ``train`` with every input tensor of more than one
  element non-contiguous (``noncontiguous_like``).

Results are compared with ``TestCase.assertEqual`` (per-dtype tolerances,
loosened where the ModuleInfo has a float32 ``toleranceOverride`` for CPU in
any of torch's module tests); where CPU raises, openreg must raise the same
exception type.

Samples that do not match are listed, each with its reason, in
``tests/modules_expected_failures.yaml``; a test fails when a sample fails that
is not listed, and also when a listed sample passes (so the list only shrinks).
``OPENREG_MODULEINFO_ONLY=nn.Linear,nn.GRU`` limits the run to some modules.
The summary at the end of the pytest output gives the figures
(``OPENREG_MODULEINFO_REPORT=report.json`` writes them per module).
"""

from __future__ import annotations

import copy
import os
import time
import warnings

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, toleranceOverride
from torch.testing._internal.common_methods_invocations import DecorateInfo
from torch.testing._internal.common_modules import (
    FunctionInput,
    ModuleInfo,
    ModuleInput,
    TrainEvalMode,
    module_db,
    modules,
)
from torch.testing._internal.common_utils import TestCase, noncontiguous_like
from torch.utils._pytree import tree_flatten, tree_map

import conformance
import opinfo_report

MODES = ("queue_all", "discrete")  # the extra CI passes that run this file (tests/conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED_FAILURES_FILE = os.path.join(HERE, "modules_expected_failures.yaml")
SEED = 1234
KINDS = ("eval", "train", "to", "state_dict", "error", "channels_last", "noncontiguous")


class TiedEmbeddingClassifier(torch.nn.Module):
    """An embedding whose weight is also the output projection's (a language
    model's tied head). module_db has no module whose parameter is shared by
    two submodules, the case Module.to must keep tied."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.embedding = torch.nn.Embedding(num_embeddings, embedding_dim)
        self.head = torch.nn.Linear(embedding_dim, num_embeddings, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, indices):
        return self.head(torch.tanh(self.embedding(indices)))


def tied_embedding_inputs(module_info, device, dtype, requires_grad, training, **kwargs):
    indices = torch.tensor([[0, 3, 5], [7, 3, 1]], device=device)
    return [ModuleInput(constructor_input=FunctionInput(8, 4), forward_input=FunctionInput(indices))]


MODULES = module_db + [ModuleInfo(TiedEmbeddingClassifier, module_inputs_func=tied_embedding_inputs)]
EXPECTED_FAILURES, _ = conformance.load_expected_failures(EXPECTED_FAILURES_FILE, KINDS)

_unknown = set(EXPECTED_FAILURES) - {m.name for m in MODULES}
assert not _unknown, f"{EXPECTED_FAILURES_FILE} names modules ModuleInfo does not have: {sorted(_unknown)}"

_only = os.environ.get("OPENREG_MODULEINFO_ONLY")
if _only:
    MODULES = [m for m in MODULES if m.name in _only.split(",")]


def tolerance(module_info) -> tuple[float, float]:
    """(atol, rtol) for float32: the largest of the ModuleInfo's
    toleranceOverrides that apply to float32 on the CPU, whatever torch test
    they decorate (0 where it has none: TestCase's defaults then)."""
    atol = rtol = 0.0
    for info in module_info.decorators:
        if not isinstance(info, DecorateInfo) or info.device_type not in (None, "cpu"):
            continue
        if info.dtypes is not None and torch.float32 not in info.dtypes:
            continue
        for decorator in info.decorators:
            if isinstance(decorator, toleranceOverride) and torch.float32 in decorator.d:
                atol = max(atol, decorator.d[torch.float32].atol)
                rtol = max(rtol, decorator.d[torch.float32].rtol)
    return atol, rtol


def reseed(value=SEED):
    conformance.reseed(value)


def outcome(fn, *args):
    """(fn(*args), None) or (None, the exception it raised)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args), None
    except Exception as e:  # noqa: BLE001 (the exception type is what is compared)
        return None, e


def fresh_inputs(function_input, device):
    """(args, kwargs) of `function_input` with every tensor copied to `device`
    as a new leaf (requires_grad kept), the same tensor passed twice becoming
    one copy (nn.MultiheadAttention takes its fast path when query is key)."""
    copies = {}

    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in copies:
            copies[id(t)] = t.detach().to(device, copy=True).requires_grad_(t.requires_grad)
        return copies[id(t)]

    return tree_map(move, (function_input.args, function_input.kwargs))


def construct(module_info, sample, seed=SEED):
    """The sample's module on the CPU; its constructor arguments are copied
    (a module may keep a tensor it was given)."""
    reseed(seed)
    args, kwargs = copy.deepcopy((sample.constructor_input.args, sample.constructor_input.kwargs))
    return module_info.module_cls(*args, **kwargs)


def state(module):
    return {**dict(module.named_parameters(remove_duplicate=False)), **dict(module.named_buffers(remove_duplicate=False))}


def memory_format(t):
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())


def in_memory_format(t):
    """A 4-d (5-d) tensor in channels_last (channels_last_3d), a leaf as `t` was."""
    if not isinstance(t, torch.Tensor) or memory_format(t) is None:
        return t
    return t.detach().contiguous(memory_format=memory_format(t)).requires_grad_(t.requires_grad)


def noncontiguous(t):
    if not isinstance(t, torch.Tensor) or t.numel() <= 1 or t.layout != torch.strided:
        return t
    return noncontiguous_like(t.detach()).requires_grad_(t.requires_grad)


def has_memory_format_input(sample) -> bool:
    leaves = tree_flatten((sample.forward_input.args, sample.forward_input.kwargs))[0]
    return any(isinstance(t, torch.Tensor) and memory_format(t) is not None for t in leaves)


def prepared(module_info, sample, device, training, reference=None, layout=None):
    """(module, args, kwargs) on `device`: the module constructed on the CPU and
    moved, lazy parameters initialised by a first forward, then the values of
    `reference` (the CPU module) copied in. `layout` ("channels_last" or
    "noncontiguous") transforms the inputs (and, for channels_last, the 4-d
    and 5-d parameters) on both devices alike."""
    module = construct(module_info, sample)
    if device != "cpu":
        module.to(device)
    if layout == "channels_last":
        for fmt in (torch.channels_last, torch.channels_last_3d):
            module.to(memory_format=fmt)  # applies to parameters of its rank only
    module.train(training)
    args, kwargs = fresh_inputs(sample.forward_input, device)
    if layout is not None:
        args, kwargs = tree_map(in_memory_format if layout == "channels_last" else noncontiguous, (args, kwargs))
    if module_info.is_lazy:
        with torch.no_grad():
            module(*args, **kwargs)
    if reference is not None:
        source = state(reference)
        with torch.no_grad():
            for name, tensor in state(module).items():
                tensor.copy_(source[name])
    return module, args, kwargs


def grad_leaves(args, kwargs):
    seen, leaves = set(), []
    for leaf in tree_flatten((args, kwargs))[0]:
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and id(leaf) not in seen:
            seen.add(id(leaf))
            leaves.append(leaf)
    return leaves


def forward(module, args, kwargs):
    reseed()  # dropout, RReLU, FractionalMaxPool draw from the device's generator
    with torch.no_grad():
        return module(*args, **kwargs)


def forward_backward(module, args, kwargs):
    """What a training step computes: outputs, gradients (for output
    gradients drawn from a CPU generator, the same on every device) and the
    buffers it updates."""
    reseed()
    output = module(*args, **kwargs)
    outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    generator = torch.Generator().manual_seed(SEED)
    grads = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in outputs]
    if outputs:
        torch.autograd.backward(outputs, grads)
    return {
        "output": output,
        "input grads": [t.grad for t in grad_leaves(args, kwargs)],
        "parameter grads": {name: p.grad for name, p in module.named_parameters()},
        "buffers": dict(module.named_buffers()),
    }


class TestModuleInfoOnDevice(conformance.CpuOracle, TestCase):
    """The ModuleInfo samples on the device, compared with CPU."""

    def run_forward(self, module_info, sample, training, layout=None) -> str | None:
        step = forward_backward if training else forward
        # Both modules are prepared before either runs: the device module
        # copies the CPU module's buffers, which a training step updates.
        built, expected_error = outcome(prepared, module_info, sample, "cpu", training, None, layout)
        reference = built[0] if built is not None else None
        moved, actual_error = outcome(prepared, module_info, sample, self.device_type, training, reference, layout)
        expected = actual = None
        if built is not None:
            expected, expected_error = outcome(step, *built)
        if moved is not None:
            actual, actual_error = outcome(step, *moved)
        return self.compare(expected, expected_error, actual, actual_error)

    def run_to(self, module_info, sample) -> str | None:
        module, error = outcome(construct, module_info, sample)
        if error is not None:
            return None  # CPU cannot build it: nothing to move
        before = list(module.named_parameters(remove_duplicate=False))
        count = len(list(module.parameters()))
        values = {
            name: t.detach().clone()
            for name, t in state(module).items()
            if not torch.nn.parameter.is_lazy(t)
        }
        _, error = outcome(module.to, self.device_type)
        if error is not None:
            return f"Module.to raised {type(error).__name__}: {str(error)[:300]}"
        after = dict(module.named_parameters(remove_duplicate=False))
        problems = []
        replaced = [name for name, p in before if after.get(name) is not p]
        if replaced:
            problems.append(f"Module.to replaced the Parameter objects {replaced[:4]}")
        shared = {}
        for name, p in before:
            shared.setdefault(id(p), []).append(name)
        untied = [names for names in shared.values() if len({id(after.get(n)) for n in names}) > 1]
        if untied:
            problems.append(f"tied parameters {untied} are no longer one Parameter")
        if len(list(module.parameters())) != count:
            problems.append(f"parameters() counts {len(list(module.parameters()))}, was {count}")
        moved = state(module)
        elsewhere = [name for name, t in moved.items() if t.device.type != self.device_type]
        if elsewhere:
            problems.append(f"{elsewhere[:4]} not on {self.device_type}")
        if not problems:
            problems.append(self.compare(values, None, {n: moved[n] for n in values}, None, check_device=False))
        return "; ".join(p for p in problems if p) or None

    def run_state_dict(self, module_info, sample) -> str | None:
        def round_trip():
            cpu, _, _ = prepared(module_info, sample, "cpu", training=True)
            module, _, _ = prepared(module_info, sample, self.device_type, training=True, reference=cpu)
            saved = module.state_dict()
            host = construct(module_info, sample, seed=SEED + 1)
            host.load_state_dict(saved)
            back = construct(module_info, sample, seed=SEED + 2).to(self.device_type)
            back.load_state_dict(host.state_dict())
            return saved, host.state_dict(), back.state_dict()

        result, error = outcome(round_trip)
        if error is not None:
            return f"raised {type(error).__name__}: {str(error)[:300]}"
        saved, host, back = result
        for module_name, loaded, device_type in (("CPU", host, "cpu"), ("device", back, self.device_type)):
            for name, t in loaded.items():
                if t.device.type != device_type:
                    return f"the {module_name} module's {name} is on {t.device} after load_state_dict"
        return self.compare(conformance.on_cpu((saved, saved)), None, (host, back), None, check_device=False)

    def run_error(self, module_info, error_input) -> str | None:
        sample = error_input.module_error_input
        expected, expected_error = outcome(
            lambda: forward(*prepared(module_info, sample, "cpu", training=False)))
        def on_device():
            result = forward(*prepared(module_info, sample, self.device_type, training=False))
            torch.openreg.synchronize()  # where a kernel's error is reported
            return result

        actual, actual_error = outcome(on_device)
        return self.compare(expected, expected_error, actual, actual_error)

    def samples(self, module_info, training):
        reseed()  # the values of the samples do not depend on the tests run before
        return list(module_info.module_inputs_func(
            module_info, device="cpu", dtype=torch.float32, requires_grad=training, training=training))

    # One test per ModuleInfo: train_only gives one training flag; the test runs both modes.
    @modules(MODULES, allowed_dtypes=(torch.float32,), train_eval_mode=TrainEvalMode.train_only)
    def test_matches_cpu(self, device, dtype, module_info, training):
        name = module_info.name
        self.precision, self.rel_tol = tolerance(module_info)
        started = time.perf_counter()
        runs: dict[str, int] = {}
        failures: dict[str, str] = {}

        def run(kind, index, problem):
            runs[kind] = runs.get(kind, 0) + 1
            if problem is not None:
                failures[f"{kind}/{index}"] = problem

        for index, sample in enumerate(self.samples(module_info, training=False)):
            run("eval", index, self.run_forward(module_info, sample, training=False))
        for index, sample in enumerate(self.samples(module_info, training=True)):
            run("train", index, self.run_forward(module_info, sample, training=True))
            run("to", index, self.run_to(module_info, sample))
            run("state_dict", index, self.run_state_dict(module_info, sample))
            if has_memory_format_input(sample):
                run("channels_last", index, self.run_forward(module_info, sample, True, "channels_last"))
            run("noncontiguous", index, self.run_forward(module_info, sample, True, "noncontiguous"))
        if module_info.module_error_inputs_func is not None:
            reseed()
            error_inputs = module_info.module_error_inputs_func(
                module_info, device="cpu", dtype=dtype, requires_grad=False, training=False)
            for index, error_input in enumerate(error_inputs):
                run("error", index, self.run_error(module_info, error_input))

        expected = conformance.expand(EXPECTED_FAILURES.get(name, {}), runs)
        opinfo_report.record_module(
            name,
            samples=runs,
            failed={kind: sum(s.startswith(kind + "/") for s in failures) for kind in runs},
            reasons=[expected[s] for s in failures if s in expected],
            seconds=time.perf_counter() - started,
            problems=failures,
        )
        message = conformance.unexpected(name, failures, expected, EXPECTED_FAILURES_FILE)
        if message:
            self.fail(message)


instantiate_device_type_tests(TestModuleInfoOnDevice, globals(), only_for="openreg")
