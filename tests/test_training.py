"""Training on openreg: autograd through every route an operator can take
(routes kernel, structured, cpu_kernel, fallback, custom_op), optimizers
with their state on the device, checkpoints, and multi-step parity with CPU."""

import io
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from torch_openreg.info import classify

MODES = ("queue_all", "discrete")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"


def leaves(*tensors):
    """The same values as leaf tensors on CPU and on openreg."""
    cpu = [t.detach().clone().requires_grad_() for t in tensors]
    dev = [t.detach().to(DEV).requires_grad_() for t in tensors]
    return cpu, dev


def grads_match(fn, *inputs, cpu_fn=None, **tolerance):
    cpu, dev = leaves(*inputs)
    out_cpu, out_dev = (cpu_fn or fn)(*cpu), fn(*dev)
    assert out_dev.device.type == DEV
    assert_close(out_dev.cpu(), out_cpu, **tolerance)
    weight = torch.randn_like(out_cpu)
    (out_cpu * weight).sum().backward()
    (out_dev * weight.to(DEV)).sum().backward()
    for c, d in zip(cpu, dev):
        assert d.grad.device.type == DEV
        assert_close(d.grad.cpu(), c.grad, **tolerance)


def add_relu_on_cpu(a, b):
    # openreg::add_relu exists only on openreg; this is its definition.
    return torch.relu(a + 2.0 * b)


@pytest.mark.parametrize(
    "name, fn, cpu_fn",
    [
        ("native add/mul (structured + stub)", lambda a, b: (a + b) * b, None),
        ("structured unary chain", lambda a, b: torch.sigmoid(a).tanh() * b.exp(), None),
        ("reduction", lambda a, b: (a * b).sum(1), None),
        ("matmul (structured, openreg impl)", lambda a, b: a @ b.t(), None),
        ("gather (structured, openreg impl)", lambda a, b: torch.gather(a * b, 1, torch.tensor([[0, 2, 5]] * 5, device=a.device)), None),
        ("scatter_add (structured, CPU impl on CPU aliases)",
         lambda a, b: torch.scatter_add(a, 1, torch.tensor([[0, 2, 2]] * 5, device=a.device), b[:, :3]), None),
        ("cumsum (structured, CPU impl on CPU aliases)", lambda a, b: torch.cumsum(a * b, 1), None),
        ("softmax (structured, CPU impl on CPU aliases)", lambda a, b: torch.softmax(a, 1) * b, None),
        ("std (CPU kernel on device memory)", lambda a, b: torch.std(a * b, 1), None),
        ("logcumsumexp (CPU fallback)", lambda a, b: torch.logcumsumexp(a * b, 1), None),
        ("views and indexing", lambda a, b: a.t()[1:, ::2] * b.t()[1:, ::2], None),
        ("flip (CPU kernel on device memory)", lambda a, b: torch.flip(a * b, [1]), None),
        ("custom op openreg::add_relu", lambda a, b: torch.ops.openreg.add_relu(a, b, alpha=2.0), add_relu_on_cpu),
    ],
)
def test_gradients_equal_cpu_for_every_route(name, fn, cpu_fn):
    torch.manual_seed(0)
    grads_match(fn, torch.randn(5, 6), torch.randn(5, 6), cpu_fn=cpu_fn)


def test_the_routes_above_are_what_they_say():
    # If one of these becomes native the test above still passes, but its
    # labels lie; update them (pick another fallback op) when this fails.
    for op in ("aten::std.correction", "aten::flip"):
        assert classify(op).served_by.startswith("cpu_kernel "), op
    for op in ("aten::scatter_add", "aten::cumsum", "aten::_softmax", "aten::_softmax_backward_data"):
        assert classify(op).served_by.startswith("structured_on_cpu_aliases "), op
    assert classify("aten::mm").served_by == "structured_impl openreg::native::mm_out"
    assert classify("aten::gather").served_by == "structured_impl openreg::native::gather_out"
    assert classify("aten::_logcumsumexp").category == "fallback"


def test_gradcheck_in_double_precision():
    torch.manual_seed(0)
    a = torch.randn(3, 4, dtype=torch.float64, device=DEV, requires_grad=True)
    b = torch.randn(4, 2, dtype=torch.float64, device=DEV, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: torch.tanh(x @ y).cumsum(0), (a, b))
    assert torch.autograd.gradgradcheck(lambda x, y: (x.sigmoid() @ y).sum(1), (a, b))


def test_gradient_accumulates_and_stays_on_the_device():
    w = torch.ones(3, device=DEV, requires_grad=True)
    for _ in range(3):
        (w * 2).sum().backward()
    assert w.grad.device.type == DEV
    assert torch.equal(w.grad.cpu(), torch.full((3,), 6.0))


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # No bias before batch norm: its gradient is rounding noise around 0,
        # which Adam would normalise into full-size steps that differ by device.
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = F.max_pool2d(F.gelu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def train(device, optimizer, steps=4, **options):
    torch.manual_seed(0)
    model = SmallCNN().to(device)
    opt = optimizer(model.parameters(), **options)
    torch.manual_seed(1)
    x, y = torch.randn(8, 1, 16, 16).to(device), torch.randint(0, 10, (8,)).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, opt, losses


OPTIMIZERS = [
    pytest.param(torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True), id="sgd-nesterov"),
    pytest.param(torch.optim.SGD, dict(lr=0.1, momentum=0.9, foreach=False), id="sgd-for-loop"),
    pytest.param(torch.optim.Adam, dict(lr=1e-2), id="adam"),
    pytest.param(torch.optim.Adam, dict(lr=1e-2, foreach=False), id="adam-for-loop"),
    pytest.param(torch.optim.Adam, dict(lr=1e-2, fused=True), id="adam-fused"),
    pytest.param(torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, amsgrad=True), id="adamw-amsgrad"),
    pytest.param(torch.optim.AdamW, dict(lr=1e-2, fused=True), id="adamw-fused"),
]


@pytest.mark.parametrize("optimizer, options", OPTIMIZERS)
def test_training_a_cnn_matches_cpu_step_by_step(optimizer, options):
    model, opt, losses = train(DEV, optimizer, **options)
    cpu_model, _, cpu_losses = train("cpu", optimizer, **options)
    assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.state_dict().items(), cpu_model.state_dict().values()):
        assert p.device.type == DEV, name
        assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5, msg=name)
    for state in opt.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                assert value.device.type == DEV, key


def test_foreach_is_the_default_path_on_openreg():
    # torch picks the foreach implementation for any device whose tensors are
    # not CPU (torch.optim.optimizer._default_to_fused_or_foreach).
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.zeros(2, device=DEV)]
    fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    assert foreach and not fused


@pytest.mark.parametrize("optimizer, options", OPTIMIZERS[2:4])
def test_checkpoint_round_trip_resumes_training_exactly(optimizer, options, tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(8, 1, 16, 16, device=DEV), torch.randint(0, 10, (8,), device=DEV)

    def step(model, opt):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    torch.manual_seed(2)
    model = SmallCNN().to(DEV)
    opt = optimizer(model.parameters(), **options)
    for _ in range(2):
        step(model, opt)
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    for _ in range(2):
        step(model, opt)

    checkpoint = torch.load(path)
    assert checkpoint["model"]["fc.weight"].device.type == DEV
    resumed = SmallCNN().to(DEV)
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = optimizer(resumed.parameters(), **options)
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    for state in resumed_opt.state.values():
        assert state["exp_avg"].device.type == DEV
    for _ in range(2):
        step(resumed, resumed_opt)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach().cpu())


def test_checkpoint_saved_on_openreg_loads_on_cpu_with_map_location():
    model = SmallCNN().to(DEV)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, map_location="cpu")
    assert all(v.device.type == "cpu" for v in state.values())
    cpu_model = SmallCNN()
    cpu_model.load_state_dict(state)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach())


def test_eval_mode_and_no_grad_inference_match_cpu():
    model, _, _ = train(DEV, torch.optim.SGD, lr=0.1)
    cpu_model, _, _ = train("cpu", torch.optim.SGD, lr=0.1)
    model.eval(), cpu_model.eval()
    x = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        out = model(x.to(DEV))
    assert not out.requires_grad
    assert_close(out.cpu(), cpu_model(x).detach(), rtol=1e-4, atol=1e-5)


THREADS = "['pt_autograd_0', 'pt_autograd_1']"
AUTOGRAD_THREADS = """
import os, torch
from torch_openreg import openreg
def threads():
    return sorted(n for n in (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
                  if n.startswith("pt_autograd_"))
x = torch.ones(3, device="openreg", requires_grad=True)
{work}
before = threads()
openreg._settle_autograd_threads()
print(before, threads(), len(openreg._SETTLED), [float(t.sum()) for t in openreg._SETTLED[2::3]],
      torch.ones(1).device.type)  # a default device still holds
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread names from /proc")
@pytest.mark.parametrize("work, expected", [
    ("(x * 2).sum().backward()", f"{THREADS} {THREADS} 6 [2.0, 2.0] cpu"),
    ("(x * 2).sum()", "[] [] 0 [] cpu"),
    ("torch.set_default_device('openreg'); (x * 2).sum().backward()", f"{THREADS} {THREADS} 6 [2.0, 2.0] openreg"),
], ids=["after_a_backward", "without_one", "under_a_default_device"])
def test_exit_handler_runs_a_backward_on_each_device_whose_autograd_thread_exists(work, expected):
    """torch drops a backward's GraphTask, which holds Python objects, on the device's
    autograd thread, possibly after backward() returned; at the interpreter's
    finalisation that thread aborts the process. The exit handler waits for each such
    thread with a backward of its own, and starts none in a process that never ran one."""
    code = AUTOGRAD_THREADS.replace("{work}", work)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OPENREG_DEVICE_COUNT": "2"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
