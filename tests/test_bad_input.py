"""Bad input, continued from test_errors.py: each mistake raises a clear Python
exception (the type CPU raises, or the one torch.cuda raises for device
mistakes, and a message saying what was wrong), and afterwards both devices
still compute correctly and hold exactly the device memory they held before."""

import gc
import warnings

import pytest
import torch
from torch.testing import assert_close

MODES = ("queue_all", "blocking")  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"
GiB = 1 << 30


def allocated() -> list[int]:
    return [torch.openreg.memory_allocated(i) for i in range(torch.openreg.device_count())]


@pytest.fixture
def recovers():
    """Records each device's allocated bytes before the test; afterwards checks
    that every device still computes right and that nothing was leaked."""
    for i in range(torch.openreg.device_count()):
        torch.openreg.synchronize(i)
    gc.collect()
    before = allocated()
    yield
    for i in range(torch.openreg.device_count()):
        x = torch.arange(6.0).reshape(2, 3)
        d = x.to(f"openreg:{i}")
        assert_close((d * 2 + 1).sum(dim=0).cpu(), (x * 2 + 1).sum(dim=0))  # structured kernels
        assert_close((d @ d.T).abs().cpu(), (x @ x.T).abs())  # CPU fallback
        del d
        torch.openreg.synchronize(i)
    gc.collect()
    assert allocated() == before
    assert torch.openreg.current_device() == 0
    assert all(torch.openreg.current_stream(i).stream_id == 0 for i in range(torch.openreg.device_count()))


def raises_like_cpu(fn, *tensors, match):
    """fn raises on CPU tensors and on openreg copies of them: the same exception
    type, with `match` in both messages."""
    with pytest.raises(Exception, match=match) as on_cpu:
        fn(*tensors)
    with pytest.raises(type(on_cpu.value), match=match) as on_device:
        fn(*(t.to(DEV) for t in tensors))
    assert type(on_device.value) is type(on_cpu.value), (on_cpu.value, on_device.value)
    return on_device.value


def raises_in_kernel(fn, *tensors, match):
    """Like raises_like_cpu for a mistake only the kernel can see (the index
    values): openreg, like CUDA, may report it at the next synchronising call,
    as torch.AcceleratorError naming the kernel, or at the call itself (a first
    launch, OPENREG_LAUNCH_BLOCKING=1) as the exception CPU raises."""
    with pytest.raises(Exception, match=match) as on_cpu:
        fn(*tensors)
    with pytest.raises((type(on_cpu.value), torch.AcceleratorError), match=match) as on_device:
        fn(*(t.to(DEV) for t in tensors))
        torch.openreg.synchronize()
    return on_device.value


# -- tensors on two devices -----------------------------------------------------------

SAME_DEVICE = r"same device.*openreg:[01].*openreg:[01]"


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda a, b: a.add_(b), id="in_place_structured"),
        pytest.param(lambda a, b: torch.add(a, a, out=b), id="out_structured"),
        pytest.param(lambda a, b: torch.abs(a, out=b), id="out_fallback"),
        pytest.param(lambda a, b: a.view(3, 1) @ b.view(1, 3), id="matmul_fallback"),
        pytest.param(lambda a, b: torch.stack([a, b]), id="stack"),
        pytest.param(lambda a, b: a.index_select(0, b.long()), id="index_on_other_device"),
        pytest.param(lambda a, b: torch.nn.functional.embedding(b.long(), a.view(3, 1)), id="embedding"),
        pytest.param(lambda a, b: torch.ops.openreg.add_relu(a, b), id="custom_op"),
        pytest.param(lambda a, b: torch.where(a > 0, a, b), id="where"),
    ],
)
def test_tensors_on_two_openreg_devices_are_rejected(recovers, op):
    a = torch.ones(3, device="openreg:0")
    b = torch.zeros(3, device="openreg:1")
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        op(a, b)
    assert a.cpu().tolist() == [1.0, 1.0, 1.0] and b.cpu().tolist() == [0.0, 0.0, 0.0]  # nothing written


def test_copy_between_devices_is_allowed(recovers):
    a = torch.arange(3.0, device="openreg:0")
    b = torch.zeros(3, device="openreg:1")
    b.copy_(a)
    assert b.cpu().tolist() == [0.0, 1.0, 2.0]


# -- indices out of range ---------------------------------------------------------------

OUT_OF_RANGE = r"out of (range|bounds)"


def idx(*values):
    return torch.tensor(values)


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda x, i: x.index_select(0, i), id="index_select"),
        pytest.param(lambda x, i: x.gather(0, i), id="gather"),
        pytest.param(lambda x, i: torch.nn.functional.embedding(i, x.view(5, 2)), id="embedding"),
        pytest.param(lambda x, i: x[i], id="getitem"),
        pytest.param(lambda x, i: x.__setitem__(i, 1.0), id="setitem"),
        pytest.param(lambda x, i: x.index_put_((i,), torch.ones((), device=x.device)), id="index_put_"),
        pytest.param(lambda x, i: x.scatter_(0, i, 1.0), id="scatter_"),
        pytest.param(lambda x, i: x.take(i), id="take"),
        pytest.param(lambda x, i: x.index_add_(0, i, torch.ones(1, device=x.device)), id="index_add_"),
        pytest.param(lambda x, i: x.index_copy_(0, i, torch.ones(1, device=x.device)), id="index_copy_"),
        pytest.param(lambda x, i: x.index_fill_(0, i, 2.0), id="index_fill_"),
    ],
)
@pytest.mark.parametrize("bad", [10, 12, -11], ids=["at_size", "beyond", "negative"])
def test_out_of_range_index_raises_like_cpu(recovers, op, bad):
    x = torch.arange(10.0)
    raises_in_kernel(op, x, idx(bad), match=OUT_OF_RANGE)


def test_out_of_range_cpu_index_of_an_openreg_tensor(recovers):
    # index.Tensor accepts CPU indices next to openreg tensors (fallback.cpu_tensor_args).
    x = torch.arange(10.0, device=DEV)
    with pytest.raises((IndexError, torch.AcceleratorError), match="index 12 is out of bounds for dimension 0"):
        x[idx(12)]
        torch.openreg.synchronize()
    with pytest.raises((IndexError, torch.AcceleratorError), match="index 12 is out of bounds"):
        x[idx(12)] = 0.0
        torch.openreg.synchronize()
    assert x.cpu().tolist() == list(range(10))


@pytest.mark.parametrize(
    "op,match",
    [
        (lambda x: x[10], "index 10 is out of bounds for dimension 0 with size 10"),
        (lambda x: x.select(0, -11), r"select\(\): index -11 out of range"),
        (lambda x: x.narrow(0, 8, 5), r"start \(8\) \+ length \(5\) exceeds dimension size \(10\)"),
        (lambda x: x.sum(dim=3), "Dimension out of range"),
        (lambda x: x.topk(11), "selected index k out of range"),
        (lambda x: x.view(3, 4), r"shape '\[3, 4\]' is invalid for input of size 10"),
        (lambda x: (x - 1).long().bincount(), "non-negative"),
    ],
    ids=["int_index", "select", "narrow", "dim", "topk", "view", "bincount"],
)
def test_bad_positions_and_shapes_raise_like_cpu(recovers, op, match):
    raises_like_cpu(op, torch.arange(10.0), match=match)


def test_one_hot_with_a_class_out_of_range_fails_in_its_kernel(recovers):
    # CPU checks the classes first ("Class values must be smaller than num_classes");
    # openreg, like CUDA, reports the index its scatter kernel finds out of bounds.
    raises_in_kernel(lambda x: torch.nn.functional.one_hot(x.long(), 3), torch.arange(10.0), match="num_classes|out of bounds")


# -- dtypes no kernel supports ------------------------------------------------------------


@pytest.mark.parametrize(
    "op,match",
    [
        (lambda x: x.to(torch.uint16) + 1, "not implemented for 'UInt16'"),
        (lambda x: x.to(torch.float8_e4m3fn) + 1, "not implemented for 'Float8_e4m3fn'"),
        (lambda x: x.bitwise_and(x), "not implemented for 'Float'"),  # structured
        (lambda x: x << 1, "not implemented for 'Float'"),
        (lambda x: torch.gcd(x, x), "not implemented for 'Float'"),
        (lambda x: torch.lerp(x.long(), x.long(), 0.5), "not implemented for 'Long'"),
        (lambda x: torch.maximum(x.to(torch.complex64), x.to(torch.complex64)), "not implemented for complex"),
        (lambda x: x.long().add_(1.5), "result type Float can't be cast to the desired output type Long"),
        (lambda x: torch.sqrt(x, out=torch.empty(10, dtype=torch.int64, device=x.device)), "can't be cast"),
        (lambda x: -(x > 0), "Negation, the `-` operator, on a bool tensor is not supported"),
        (lambda x: x.gather(0, torch.zeros(1, device=x.device)), "Expected dtype int32/int64 for index"),
        (lambda x: x.cumsum(0, dtype=torch.bool).sum(), "not implemented for 'Bool'"),
    ],
    ids=["uint16", "float8", "bitwise_float", "shift_float", "gcd_float", "lerp_long", "maximum_complex",
         "in_place_cast", "out_cast", "neg_bool", "float_index", "cumsum_bool"],
)
def test_unsupported_dtype_raises_like_cpu(recovers, op, match):
    x = torch.arange(10.0)
    try:
        expected = op(x)
    except Exception as e:  # noqa: BLE001 - the oracle decides what should happen
        with pytest.raises(type(e), match=match):
            op(x.to(DEV))
    else:
        assert_close(op(x.to(DEV)).cpu(), expected)


# -- out of memory --------------------------------------------------------------------------


def huge(dtype=torch.float32, gib=12):
    """A device tensor of `gib` GiB that owns 4 bytes (stride 0), so operators
    that materialise it ask the 8 GiB device for more than it has."""
    n = gib * GiB // torch.empty((), dtype=dtype).element_size()
    return torch.ones(1, dtype=dtype, device=DEV).expand(n)


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda: torch.empty(9 * GiB, dtype=torch.uint8, device=DEV), id="empty"),
        pytest.param(lambda: huge() + 1, id="structured_output"),
        pytest.param(lambda: huge().abs(), id="fallback_output"),
        pytest.param(lambda: huge().contiguous(), id="contiguous"),
        pytest.param(lambda: torch.cat([huge(gib=5), huge(gib=5)]), id="cat"),
        pytest.param(lambda: torch.empty(0, device=DEV).resize_(3 * GiB), id="resize_"),
        # The first output (6 GiB of values) fits, the second (12 GiB of int64
        # indices) does not: the first must be given back.
        pytest.param(lambda: huge(gib=12).view(2, -1).max(dim=0), id="second_output_structured"),
        pytest.param(lambda: huge(gib=12).view(2, -1).sort(dim=0), id="second_output_fallback"),
        pytest.param(lambda: torch.empty(9 * GiB, dtype=torch.uint8, device="openreg:1"), id="device_1"),
    ],
)
def test_out_of_memory_raises_and_gives_everything_back(recovers, op):
    ooms = sum(torch.openreg.memory_stats(i)["num_ooms"] for i in range(2))
    with pytest.raises(torch.OutOfMemoryError, match=r"openreg out of memory\. Tried to allocate [\d.]+ GiB\. "
                       r"openreg:[01] has a total capacity of 8\.00 GiB"):
        op()
    assert sum(torch.openreg.memory_stats(i)["num_ooms"] for i in range(2)) > ooms


def test_out_of_memory_in_a_small_device_then_everything_fits_again():
    # A 64 MiB device (OPENREG_DEVICE_MEMORY) filled with live tensors: each
    # further allocation fails cleanly; freeing them makes room for all of it.
    from test_device_memory import run_python

    result = run_python(
        """
        import gc, torch
        MiB = 1 << 20
        base = torch.openreg.memory_allocated(0)
        live = [torch.ones(MiB // 4, device="openreg") for _ in range(60)]
        failures = 0
        for attempt in (lambda: torch.empty(8 * MiB, dtype=torch.uint8, device="openreg"),
                        lambda: torch.cat(live[:8]),
                        lambda: live[0].expand(8, -1).contiguous(),
                        lambda: torch.ones(8 * MiB, dtype=torch.uint8).to("openreg")):
            try:
                attempt()
            except torch.OutOfMemoryError as e:
                failures += "openreg:0 has a total capacity of 64.00 MiB" in str(e)
        assert torch.openreg.memory_allocated(0) == base + 60 * MiB
        del live
        gc.collect()
        assert torch.openreg.memory_allocated(0) == base
        torch.openreg.empty_cache()
        big = torch.full((60 * MiB // 4,), 2.0, device="openreg")
        print(failures, big.sum().item() == 2.0 * 60 * MiB / 4, torch.openreg.memory_stats(0)["num_ooms"])
        """,
        env={"OPENREG_DEVICE_MEMORY": "64M"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["4", "True", "4"]


# -- streams and events ---------------------------------------------------------------------


def bad_stream(device: int, stream_id: int) -> torch.Stream:
    kind = torch.openreg.current_stream().device_type
    return torch.openreg.Stream(stream_id=stream_id, device_index=device, device_type=kind)


INVALID_STREAM = r"invalid openreg stream id (999|-5): openreg streams come from"


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda s: s.query(), id="query"),
        pytest.param(lambda s: s.synchronize(), id="synchronize"),
        pytest.param(lambda s: torch.openreg.set_stream(s), id="set_stream"),
        pytest.param(lambda s: torch.openreg.Event().record(s), id="event_record"),
        pytest.param(lambda s: s.wait_stream(torch.openreg.current_stream()), id="wait_stream"),
        pytest.param(lambda s: torch.ones(2, device=s.device).record_stream(s), id="record_stream"),
    ],
)
@pytest.mark.parametrize("stream_id", [999, -5])
def test_invalid_stream_is_rejected(recovers, op, stream_id):
    with pytest.raises(RuntimeError, match=INVALID_STREAM):
        op(bad_stream(0, stream_id))


@pytest.mark.parametrize("device", [0, 1])
def test_failed_stream_context_leaves_device_and_stream_unchanged(recovers, device):
    with pytest.raises(RuntimeError, match=INVALID_STREAM):
        with torch.openreg.stream(bad_stream(device, 999)):
            pass  # pragma: no cover - never entered
    # recovers: current device 0, default streams


def test_stream_of_a_device_that_does_not_exist(recovers):
    with pytest.raises(RuntimeError, match="device index is out of range: openreg:7.*OPENREG_DEVICE_COUNT"):
        bad_stream(7, 1).query()
    with pytest.raises(RuntimeError, match="device index is out of range: openreg:5"):
        torch.openreg.Stream(device=5)
    with pytest.raises(ValueError, match="expected an openreg device, got cpu"):
        torch.openreg.Stream(device="cpu")


def test_event_recorded_on_another_devices_stream_is_rejected(recovers):
    e = torch.openreg.Event()
    e.record(torch.openreg.Stream(device=1))
    with pytest.raises(RuntimeError, match="event of openreg:1 cannot be recorded on a stream of openreg:0"):
        e.record(torch.openreg.Stream(device=0))
    e.synchronize()
    assert e.query()


def test_event_misuse_is_rejected(recovers):
    with pytest.raises(RuntimeError, match="does not match recording stream's device type CPU"):
        torch.openreg.Event().record(torch.Stream(device="cpu"))
    with pytest.raises(ValueError, match="Both events must be recorded"):
        torch.openreg.Event(enable_timing=True).elapsed_time(torch.openreg.Event(enable_timing=True))
    with pytest.raises(RuntimeError, match="does not match other's device type CPU"):
        torch.openreg.Event(enable_timing=True).elapsed_time(torch.Event(device="cpu"))
    with pytest.raises(RuntimeError, match="cpu backend doesn't support events"):
        torch.openreg.current_stream().wait_stream(torch.Stream(device="cpu"))
    with pytest.raises(RuntimeError, match="stream of the tensor's own device"):
        torch.ones(2, device=DEV).record_stream(torch.Stream(device="cpu"))


# -- blocked operators ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda t: torch.ops.aten._pin_memory(t), id="aten_op"),
        pytest.param(lambda t: t.pin_memory(), id="tensor_method"),
    ],
)
def test_blocked_operator_raises_and_the_device_keeps_working(recovers, op):
    t = torch.ones(1024, device=DEV)
    with pytest.raises(NotImplementedError, match=r"aten::_pin_memory is blocked on openreg: only CPU tensors "
                       r"can be pinned; call \.cpu\(\) first"):
        op(t)
    assert t.sum().item() == 1024


# -- named tensors ----------------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["empty", "zeros", "ones"])
def test_names_argument_is_refused_as_on_cpu(recovers, factory):
    # torch 2.13 has no named tensors (no names= argument, no Tensor.refine_names):
    # openreg answers exactly as CPU does.
    with pytest.raises(TypeError) as on_cpu:
        getattr(torch, factory)((2, 3), names=("N", "C"))
    with pytest.raises(TypeError) as on_openreg:
        getattr(torch, factory)((2, 3), names=("N", "C"), device=DEV)
    assert str(on_openreg.value) == str(on_cpu.value)
    assert "names" in str(on_cpu.value)
    assert not hasattr(torch.Tensor, "refine_names") and not hasattr(torch.Tensor, "names")


# -- quantized tensors --------------------------------------------------------------------------

QUANTIZED = r"aten::\w+: openreg has no quantized tensors \(torch 2\.13 deprecates them\)"


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch.quantize_per_tensor(torch.randn(3, device=DEV), 0.1, 0, torch.qint8), id="quantize"),
        pytest.param(
            lambda: torch.quantize_per_channel(
                torch.randn(2, 3, device=DEV), torch.ones(2, device=DEV), torch.zeros(2, dtype=torch.long, device=DEV),
                0, torch.quint8,
            ),
            id="per_channel",
        ),
        pytest.param(lambda: torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8).to(DEV), id="to_device"),
    ],
)
def test_quantized_tensors_are_refused_at_the_first_call(recovers, make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation of quantized tensors
        with pytest.raises(NotImplementedError, match=QUANTIZED) as raised:
            make()
    assert len(str(raised.value).splitlines()) == 1  # one sentence, not the dispatcher's table
