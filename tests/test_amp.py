"""Automatic mixed precision on openreg: torch.autocast("openreg") follows CUDA's
operator policy, and torch.amp.GradScaler("openreg") scales, unscales and skips
steps whose gradients are not finite."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"
LOW = (torch.float16, torch.bfloat16)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).to(DEV)


def test_autocast_registrations_are_cudas_less_the_cudnn_operators():
    cuda = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA"))
    openreg = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastPrivateUse1"))
    assert cuda - openreg == {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose"}
    assert openreg - cuda == set()


def test_supported_dtypes_and_default_dtype():
    assert torch.openreg.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.openreg.is_bf16_supported()
    assert torch.get_autocast_dtype(DEV) == torch.float16
    assert torch.amp.is_autocast_available(DEV)


@pytest.mark.parametrize("dtype", LOW)
def test_lower_precision_ops_run_in_the_autocast_dtype(dtype):
    a, b = randn(8, 8), randn(8, 8)
    image, weight = randn(2, 3, 8, 8), randn(4, 3, 3, 3)
    with torch.autocast(DEV, dtype=dtype):
        results = {
            "mm": torch.mm(a, b),
            "matmul": a @ b,
            "linear": F.linear(a, b),
            "addmm": torch.addmm(a, a, b),
            "bmm": torch.bmm(a[None], b[None]),
            "baddbmm": torch.baddbmm(a[None], a[None], b[None]),
            "mv": torch.mv(a, b[0]),
            "conv2d": F.conv2d(image, weight),
            "einsum": torch.einsum("ij,jk->ik", a, b),
        }
    for name, r in results.items():
        assert r.dtype == dtype, name
        assert r.device.type == DEV, name


@pytest.mark.parametrize("dtype", LOW)
def test_lower_precision_result_equals_the_explicitly_cast_computation(dtype):
    a, b = randn(16, 16), randn(16, 16)
    with torch.autocast(DEV, dtype=dtype):
        auto = torch.mm(a, b)
    assert_close(auto.cpu(), torch.mm(a.cpu().to(dtype), b.cpu().to(dtype)), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOW)
def test_fp32_ops_run_in_float32_even_on_lower_precision_inputs(dtype):
    x = randn(4, 5).abs().to(dtype) + 0.5
    target = randn(4, 5).to(dtype)
    with torch.autocast(DEV, dtype=dtype):
        results = {
            "exp": torch.exp(x),
            "log": torch.log(x),
            "rsqrt": torch.rsqrt(x),
            "pow": torch.pow(x, 2),
            "softmax": torch.softmax(x, 1),
            "log_softmax": torch.log_softmax(x, 1),
            "layer_norm": F.layer_norm(x, (5,)),
            "mse_loss": F.mse_loss(x, target),
            "l1_loss": F.l1_loss(x, target),
            "sum": x.sum(),
            "cumsum": x.cumsum(0),
            "norm": torch.norm(x),
            "logsumexp": torch.logsumexp(x, 1),
        }
    for name, r in results.items():
        assert r.dtype == torch.float32, name


def test_fp32_set_opt_dtype_respects_an_explicit_dtype():
    x = randn(3, 4).half()
    with torch.autocast(DEV, dtype=torch.float16):
        assert torch.softmax(x, 1).dtype == torch.float32
        assert torch.softmax(x, 1, dtype=torch.float64).dtype == torch.float64
        assert x.sum(dtype=torch.float64).dtype == torch.float64


@pytest.mark.parametrize("dtype", LOW)
def test_promote_ops_run_in_the_widest_input_type(dtype):
    a = randn(4)
    low = randn(4).to(dtype)
    with torch.autocast(DEV, dtype=dtype):
        assert torch.addcmul(a, low, low).dtype == torch.float32
        assert torch.addcmul(low, low, low).dtype == dtype
        assert torch.atan2(low, a).dtype == torch.float32
        assert torch.dot(a, low.float()).dtype == torch.float32


def test_ops_outside_the_policy_keep_their_input_dtype():
    a = randn(4)
    h = a.half()
    with torch.autocast(DEV, dtype=torch.float16):
        assert (a + a).dtype == torch.float32
        assert (h + h).dtype == torch.float16
        assert torch.relu(a).dtype == torch.float32


def test_autocast_is_scoped_nested_and_can_be_disabled_inside():
    a = randn(4, 4)
    with torch.openreg.amp.autocast(dtype=torch.bfloat16):
        assert torch.is_autocast_enabled(DEV)
        assert torch.mm(a, a).dtype == torch.bfloat16
        with torch.autocast(DEV, enabled=False):
            assert torch.mm(a, a).dtype == torch.float32
        assert torch.mm(a, a).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled(DEV)
    assert torch.mm(a, a).dtype == torch.float32


def test_cpu_autocast_does_not_touch_openreg_tensors():
    a = randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.mm(a, a).dtype == torch.float32
        assert torch.mm(a.cpu(), a.cpu()).dtype == torch.bfloat16


def test_unsupported_dtype_warns_and_leaves_autocast_off():
    a = randn(4, 4)
    with pytest.warns(UserWarning, match="openreg Autocast only supports dtypes of torch.float16, torch.bfloat16"):
        with torch.autocast(DEV, dtype=torch.float64):
            assert torch.mm(a, a).dtype == torch.float32


def test_binary_cross_entropy_is_refused_and_names_the_safe_alternative():
    p = randn(4).sigmoid()
    with torch.autocast(DEV, dtype=torch.float16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, p)
        assert F.binary_cross_entropy_with_logits(p, p).dtype == torch.float32


@pytest.mark.parametrize("dtype", LOW)
def test_backward_through_autocast_equals_the_explicitly_cast_computation_on_cpu(dtype):
    torch.manual_seed(0)
    w_cpu = torch.randn(8, 8, requires_grad=True)
    x_cpu, weights = torch.randn(4, 8), torch.randn(4, 8)
    w = w_cpu.detach().to(DEV).requires_grad_()
    with torch.autocast(DEV, dtype=dtype):
        loss = (torch.log_softmax(x_cpu.to(DEV) @ w, 1) * weights.to(DEV)).sum()
    loss.backward()
    assert w.grad.dtype == torch.float32 and w.grad.device.type == DEV
    # What the policy means: mm in `dtype`, log_softmax in float32.
    (torch.log_softmax((x_cpu.to(dtype) @ w_cpu.to(dtype)).float(), 1) * weights).sum().backward()
    assert_close(w.grad.cpu(), w_cpu.grad)


def test_weight_cast_cache_reuses_the_cast_inside_one_region():
    w = randn(8, 8).requires_grad_()
    x = randn(8, 8)
    with torch.autocast(DEV, dtype=torch.float16):
        first = torch.mm(x, w)
        second = torch.mm(x, w)
    assert_close(first, second, rtol=0, atol=0)


def make_model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)


def scaled_steps(device, steps, poison_step=None):
    model = make_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
    torch.manual_seed(1)
    x, y = torch.randn(16, 8).to(device), torch.randn(16, 1).to(device)
    scales = []
    for step in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        if step == poison_step:
            loss = loss * float("nan")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().cpu() for p in model.parameters()], scales


def test_grad_scaler_matches_cpu_including_a_skipped_nan_step():
    params, scales = scaled_steps(DEV, 6, poison_step=2)
    cpu_params, cpu_scales = scaled_steps("cpu", 6, poison_step=2)
    assert scales == cpu_scales
    # Grows every 2 good steps, halves on the NaN step: 256 -> 512 -> 256 -> ...
    assert scales[:3] == [256.0, 512.0, 256.0]
    for p, q in zip(params, cpu_params):
        assert_close(p, q)


def test_grad_scaler_skips_the_optimizer_step_on_inf_gradients():
    model = make_model(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    scaler = torch.openreg.amp.GradScaler(init_scale=1024.0)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    with torch.openreg.amp.autocast():
        loss = model(randn(4, 8)).float().sum() * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 512.0
    assert opt.state == {} or all(len(s) == 0 for s in opt.state.values())
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach().cpu(), b)


def test_autocast_and_grad_scaler_train_a_model_down():
    model = make_model(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(DEV)
    torch.manual_seed(2)
    x = torch.randn(64, 8).to(DEV)
    y = x.sum(1, keepdim=True)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        with torch.autocast(DEV, dtype=torch.float16):
            out = model(x)
            assert out.dtype == torch.float16
            loss = F.mse_loss(out, y)
            assert loss.dtype == torch.float32
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_grad_scaler_state_dict_round_trip():
    scaler = torch.amp.GradScaler(DEV, init_scale=64.0, growth_interval=3)
    model = make_model(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    scaler.scale(model(randn(2, 8)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    restored = torch.amp.GradScaler(DEV)
    restored.load_state_dict(scaler.state_dict())
    assert restored.get_scale() == scaler.get_scale() == 64.0
    assert restored._get_growth_tracker() == 1


def test_amp_helpers_run_on_device_memory_without_warnings():
    grads = [randn(3), randn(2, 2)]
    found_inf = torch.zeros(1, device=DEV)
    inv_scale = torch.full((1,), 0.5, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
    assert found_inf.item() == 0.0
    grads[1][0, 0] = float("inf")
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
    assert found_inf.item() == 1.0
