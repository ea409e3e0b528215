"""Random numbers on openreg behave as on CUDA: one default generator per device,
torch.Generator on openreg devices, seeding, RNG state, torch.random.fork_rng, and
the torch.openreg.random module."""

import copy
import inspect
import os
import pickle
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Sequence

import pytest
import torch
import torch.cuda.random

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

N_DEVICES = 2  # tests/conftest runs with the default OPENREG_DEVICE_COUNT

# Each draws 100 values (so that two different streams differ with certainty)
# from `generator`, or from the default generator of `device` when it is None.
RANDOM_OPS = {
    "rand": lambda d, g: torch.rand(100, device=d, generator=g),
    "randn": lambda d, g: torch.randn(100, device=d, generator=g),
    "randint": lambda d, g: torch.randint(0, 1000, (100,), device=d, generator=g),
    "randperm": lambda d, g: torch.randperm(100, device=d, generator=g),
    "bernoulli": lambda d, g: torch.bernoulli(torch.full((100,), 0.5, device=d), generator=g),
    "bernoulli_": lambda d, g: torch.empty(100, device=d).bernoulli_(0.3, generator=g),
    "normal": lambda d, g: torch.normal(torch.zeros(100, device=d), torch.ones(100, device=d), generator=g),
    "normal_": lambda d, g: torch.empty(100, device=d).normal_(2.0, 3.0, generator=g),
    "uniform_": lambda d, g: torch.empty(100, device=d).uniform_(-1.0, 1.0, generator=g),
    "exponential_": lambda d, g: torch.empty(100, device=d).exponential_(generator=g),
    "random_": lambda d, g: torch.empty(100, device=d).random_(0, 1000, generator=g),
    "multinomial": lambda d, g: torch.multinomial(torch.ones(100, device=d), 50, generator=g),
}


def draw(op="rand", device="openreg", generator=None):
    """The values an op draws, as a CPU tensor."""
    return RANDOM_OPS[op](device, generator).cpu()


def seeded(seed, device="openreg"):
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


ODD_DRAW_BIT = 1 << 62  # of a (seed, offset) state's offset: one more draw than the pairs


def seed_and_draws(state: torch.Tensor) -> tuple[int, int]:
    """A (seed, offset) state's seed and its position in CPU draws."""
    seed, offset = (int(v) for v in state.view(torch.int64))
    return seed % 2**64, 2 * (offset & ~ODD_DRAW_BIT) + (1 if offset & ODD_DRAW_BIT else 0)


def as_cpu_state(state: torch.Tensor) -> torch.Tensor:
    """The CPU generator state an openreg state stands for: its (seed, offset) replayed
    on a CPU generator, or a state in CPU's layout as it is."""
    if state.numel() != 16:
        return state
    seed, draws = seed_and_draws(state)
    cpu = torch.Generator().manual_seed(seed)
    torch.empty(draws).uniform_(generator=cpu)  # one CPU draw per float32
    return cpu.get_state()


# --- default generators -------------------------------------------------------


def test_default_generators_one_per_device_in_device_order():
    gens = torch.openreg.default_generators
    assert len(gens) == torch.openreg.device_count() == N_DEVICES
    assert [g.device for g in gens] == [torch.device("openreg", i) for i in range(N_DEVICES)]
    assert all(isinstance(g, torch.Generator) for g in gens)


def test_default_generators_are_the_same_objects_every_time():
    assert torch.openreg.default_generators[1] is torch.openreg.default_generators[1]
    assert list(torch.openreg.default_generators) == list(torch.openreg.default_generators)


def test_default_generators_is_a_read_only_sequence_like_cudas_tuple():
    gens = torch.openreg.default_generators
    assert isinstance(gens, Sequence)
    assert gens[-1] is gens[N_DEVICES - 1]
    assert gens[:1] == (gens[0],)
    assert gens[0] in gens and gens.index(gens[1]) == 1
    with pytest.raises(TypeError):
        gens[0] = torch.Generator()  # type: ignore[index]


def test_default_generator_is_the_one_random_ops_draw_from():
    torch.openreg.default_generators[1].manual_seed(5)
    a = draw(device="openreg:1")
    torch.openreg.default_generators[1].manual_seed(5)
    assert torch.equal(draw(device="openreg:1"), a)


# --- torch.Generator on openreg ------------------------------------------------


def test_generator_with_an_index_is_on_that_device():
    assert torch.Generator(device="openreg:1").device == torch.device("openreg:1")
    assert torch.Generator(device=torch.device("openreg", 0)).device == torch.device("openreg:0")


def test_generator_without_an_index_is_on_the_current_device():
    assert torch.Generator(device="openreg").device == torch.device("openreg:0")
    torch.openreg.set_device(1)
    assert torch.Generator(device="openreg").device == torch.device("openreg:1")


def test_generator_on_a_missing_device_raises_naming_the_range():
    with pytest.raises(RuntimeError, match=r"device index is out of range: openreg:5.*openreg:0 to openreg:1"):
        torch.Generator(device="openreg:5")


def test_new_generator_is_not_a_default_generator():
    g = torch.Generator(device="openreg:0")
    assert all(g is not d for d in torch.openreg.default_generators)
    before = torch.openreg.get_rng_state(0)
    g.manual_seed(123)
    draw(generator=g)
    assert torch.equal(torch.openreg.get_rng_state(0), before)


@pytest.mark.parametrize("op", sorted(RANDOM_OPS))
def test_explicit_generator_is_drawn_from_and_the_default_one_is_not(op):
    torch.openreg.manual_seed(1)
    default_state = torch.openreg.get_rng_state()
    from_generator = draw(op, generator=seeded(7))
    assert torch.equal(torch.openreg.get_rng_state(), default_state)  # default not advanced
    torch.openreg.manual_seed(7)
    assert torch.equal(draw(op), from_generator)  # same stream as a default seeded with 7


def test_generator_state_round_trip_replays_the_stream():
    g = seeded(3, "openreg:1")
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = draw(device="openreg:1", generator=g)
    g.set_state(state)
    assert torch.equal(draw(device="openreg:1", generator=g), a)


def test_generator_clone_state_is_an_independent_copy_on_the_same_device():
    g = seeded(3, "openreg:1")
    clone = g.clone_state()
    assert clone.device == torch.device("openreg:1") and clone is not g
    assert clone.initial_seed() == 3
    assert torch.equal(draw(device="openreg:1", generator=clone), draw(device="openreg:1", generator=g))


def test_generator_deepcopy_and_pickle_keep_device_seed_and_stream():
    g = seeded(3, "openreg:1")
    draw(device="openreg:1", generator=g)  # state differs from a fresh seed-3 generator
    for copied in (copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert copied.device == torch.device("openreg:1") and copied.initial_seed() == 3
        assert torch.equal(draw(device="openreg:1", generator=copied), draw(device="openreg:1", generator=g.clone_state()))


def test_openreg_generator_for_a_cpu_tensor_raises():
    with pytest.raises(RuntimeError, match="openreg generator but runs on the CPU"):
        torch.rand(3, generator=seeded(1))
    with pytest.raises(RuntimeError, match="openreg generator"):
        torch.empty(3).normal_(generator=seeded(1))


def test_cpu_generator_for_an_openreg_tensor_raises_like_cuda():
    with pytest.raises(RuntimeError, match="device type for generator") as info:
        torch.rand(3, generator=torch.Generator().manual_seed(1), device="openreg")
    assert "cpu" in str(info.value)


def test_generator_of_another_openreg_device_is_drawn_from_as_on_cuda():
    # at::check_generator checks the device type only, so CUDA accepts a cuda:1
    # generator for a cuda:0 tensor and draws from it; openreg does the same.
    g1 = seeded(9, "openreg:1")
    values = draw(device="openreg:0", generator=g1)
    assert torch.equal(values, draw(device="openreg:1", generator=seeded(9, "openreg:1")))
    assert not torch.equal(g1.get_state(), seeded(9, "openreg:1").get_state())  # g1 advanced


# --- seeding ---------------------------------------------------------------------


def test_torch_manual_seed_seeds_every_openreg_device():
    torch.manual_seed(11)
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [11] * N_DEVICES
    a = [draw(device=f"openreg:{i}") for i in range(N_DEVICES)]
    torch.manual_seed(11)
    assert all(torch.equal(draw(device=f"openreg:{i}"), a[i]) for i in range(N_DEVICES))


def test_openreg_manual_seed_seeds_only_the_current_device():
    torch.openreg.manual_seed_all(1)
    torch.openreg.set_device(1)
    torch.openreg.manual_seed(42)
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [1, 42]
    assert torch.openreg.initial_seed() == 42


def test_manual_seed_all_seeds_every_device_with_the_same_stream():
    torch.openreg.manual_seed_all(7)
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [7] * N_DEVICES
    assert torch.equal(draw(device="openreg:0"), draw(device="openreg:1"))


def test_seeds_are_converted_with_int_like_cuda():
    torch.openreg.manual_seed("5")  # type: ignore[arg-type]  # torch.cuda does int(seed)
    assert torch.openreg.initial_seed() == 5
    torch.openreg.manual_seed_all(6.0)  # type: ignore[arg-type]
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [6] * N_DEVICES


def test_torch_seed_gives_openreg_the_same_fresh_seed_as_cpu():
    torch.manual_seed(0)
    seed = torch.seed()
    assert seed != 0 and torch.initial_seed() == seed
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [seed] * N_DEVICES


def test_seed_reseeds_only_the_current_device():
    torch.openreg.manual_seed_all(1)
    torch.openreg.set_device(1)
    torch.openreg.seed()
    assert torch.openreg.default_generators[0].initial_seed() == 1
    assert torch.openreg.initial_seed() not in (1, 0)


def test_seed_all_gives_every_device_one_fresh_seed():
    torch.openreg.manual_seed_all(1)
    torch.openreg.seed_all()
    seeds = {g.initial_seed() for g in torch.openreg.default_generators}
    assert len(seeds) == 1 and seeds != {1}
    torch.openreg.seed_all()
    assert {g.initial_seed() for g in torch.openreg.default_generators} != seeds


def test_initial_seed_is_the_current_devices_seed():
    for i in range(N_DEVICES):
        torch.openreg.default_generators[i].manual_seed(100 + i)
    with torch.openreg.device(1):
        assert torch.openreg.initial_seed() == 101
    assert torch.openreg.initial_seed() == 100


# --- reproducible streams ------------------------------------------------------


@pytest.mark.parametrize("op", sorted(RANDOM_OPS))
def test_same_seed_gives_the_same_values_and_another_seed_other_values(op):
    torch.manual_seed(2024)
    first = draw(op)
    torch.manual_seed(2024)
    assert torch.equal(draw(op), first)
    torch.manual_seed(2025)
    assert not torch.equal(draw(op), first)


@pytest.mark.parametrize("op", sorted(RANDOM_OPS))
def test_openreg_draws_the_cpu_stream_of_the_same_seed(op):
    # Each openreg generator owns a CPU generator that the CPU kernels run on
    # device memory draw from (csrc/device/OpenRegGenerator.h): CPU is the oracle.
    torch.manual_seed(31)
    expected = RANDOM_OPS[op]("cpu", None)
    torch.manual_seed(31)
    assert torch.equal(draw(op), expected)
    assert torch.equal(draw(op, generator=seeded(8)), RANDOM_OPS[op]("cpu", torch.Generator().manual_seed(8)))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float16])
def test_randperm_out_resizes_and_draws_cpus_permutation(dtype):
    # randperm's kernel sizes `out` on the device, then runs CPU's randperm on a
    # CPU alias of it.
    for n, out_shape in [(10, (0,)), (10, (10,)), (1000, (3, 4)), (0, (5,))]:
        torch.manual_seed(7)
        expected = torch.randperm(n, dtype=dtype, out=torch.empty(out_shape, dtype=dtype))
        out = torch.empty(out_shape, dtype=dtype, device="openreg")
        torch.manual_seed(7)
        assert torch.randperm(n, dtype=dtype, out=out) is out
        assert out.device.type == "openreg"
        assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_randperm_shuffles_strided_outs_and_explicit_generators_as_cpu(dtype):
    # int64 and int32 outs are shuffled on the device by openreg's own loop
    # (randperm_fill), which must give CPU's permutation for every n, every
    # stride, and from an explicit generator's state.
    for n in [1, 2, 3, 16, 40000]:
        for step in [1, 3]:
            torch.manual_seed(n)
            cpu_base = torch.full((n * step,), -1, dtype=dtype)
            torch.randperm(n, dtype=dtype, out=cpu_base[::step])
            torch.manual_seed(n)
            base = torch.full((n * step,), -1, dtype=dtype, device="openreg")
            out = base[::step]
            assert torch.randperm(n, dtype=dtype, out=out) is out
            assert torch.equal(base.cpu(), cpu_base)  # the gaps stay untouched
    cpu_generator = torch.Generator().manual_seed(3)
    generator = seeded(3)
    for _ in range(2):  # the second draw shows the state moved on as CPU's did
        expected = torch.randperm(50, dtype=dtype, generator=cpu_generator)
        assert torch.equal(torch.randperm(50, dtype=dtype, device="openreg", generator=generator).cpu(), expected)


def test_randperm_of_int64_and_int32_skips_cpus_kernel():
    # The profiler shows CPU's kernel by the resize_ calls it makes on the
    # CPU alias; openreg's loop makes none. (The first call also runs CPU's
    # kernel once, to check that the loop gives its permutation.)
    from torch.profiler import ProfilerActivity, profile

    def ops(dtype):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            torch.randperm(16, dtype=dtype, device="openreg")
        return [event.name for event in prof.events()]

    ops(torch.int64)
    assert "aten::resize_" not in ops(torch.int64)
    assert "aten::resize_" not in ops(torch.int32)
    assert "aten::resize_" in ops(torch.float32)


def test_randperm_bad_arguments_raise_cpus_errors():
    calls = [
        lambda d: torch.randperm(-1, device=d),
        lambda d: torch.randperm(-1, out=torch.empty(0, dtype=torch.int64, device=d)),
        lambda d: torch.randperm(3000, dtype=torch.float16, device=d),
    ]
    for call in calls:
        with pytest.raises(RuntimeError) as cpu_error:
            call("cpu")
        with pytest.raises(RuntimeError) as device_error:
            call("openreg")
        assert str(device_error.value) == str(cpu_error.value)
    with pytest.raises(RuntimeError, match="device type for generator"):
        torch.randperm(4, device="openreg", generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="openreg generator but runs on the CPU"):
        torch.randperm(4, out=torch.empty(4, dtype=torch.int64), generator=seeded(1))
    assert torch.randperm(4, device="openreg").sort().values.tolist() == [0, 1, 2, 3]  # still usable


def test_consecutive_draws_continue_the_stream():
    torch.openreg.manual_seed(4)
    first, second = draw(), draw()
    assert not torch.equal(first, second)
    torch.openreg.manual_seed(4)
    assert torch.equal(draw(), first)
    assert torch.equal(draw(), second)


def test_devices_have_independent_streams():
    torch.openreg.manual_seed_all(3)
    expected = draw(device="openreg:0")
    torch.openreg.manual_seed_all(3)
    draw(device="openreg:1")  # advances openreg:1 only
    assert torch.equal(draw(device="openreg:0"), expected)


def test_cpu_draws_do_not_advance_openreg_streams():
    torch.manual_seed(3)
    expected = draw()
    torch.manual_seed(3)
    torch.rand(1000)  # CPU default generator only
    assert torch.equal(draw(), expected)


def test_random_like_ops_draw_from_the_device_generator():
    x = torch.ones(100, device="openreg:1")
    torch.openreg.default_generators[1].manual_seed(6)
    a = (torch.rand_like(x).cpu(), torch.randn_like(x).cpu(), torch.randint_like(x, 1000).cpu())
    torch.openreg.default_generators[1].manual_seed(6)
    b = (torch.rand_like(x).cpu(), torch.randn_like(x).cpu(), torch.randint_like(x, 1000).cpu())
    assert all(torch.equal(p, q) for p, q in zip(a, b))


DROPOUTS = {
    "dropout": lambda x: torch.nn.functional.dropout(x, 0.5),
    "native_dropout": lambda x: torch.native_dropout(x, 0.5, True)[0],
    "scaled_dot_product_attention": lambda x: torch.nn.functional.scaled_dot_product_attention(
        x.view(1, 1, 25, 4), x.view(1, 1, 25, 4), x.view(1, 1, 25, 4), dropout_p=0.5
    ),
}


@pytest.mark.parametrize("op", sorted(DROPOUTS))
def test_dropout_draws_from_the_device_generator_not_the_cpu_one(op):
    x = torch.arange(1.0, 101.0, device="openreg")
    torch.openreg.manual_seed(6)
    a = DROPOUTS[op](x).cpu()
    torch.default_generator.manual_seed(1)  # must not matter
    torch.openreg.manual_seed(6)
    b = DROPOUTS[op](x).cpu()
    assert torch.equal(a, b)


def test_dropout_draws_what_cpu_draws_for_the_same_seed():
    # native_dropout's openreg kernel is CPU's, run on device tensors: the
    # mask comes from bernoulli_, which draws CPU's numbers from the device's
    # generator.
    torch.manual_seed(11)
    expected = torch.native_dropout(torch.arange(1.0, 65.0), 0.3, True)
    torch.manual_seed(11)
    got = torch.native_dropout(torch.arange(1.0, 65.0, device="openreg"), 0.3, True)
    assert got[1].dtype == torch.bool and got[1].device.type == "openreg"
    assert torch.equal(got[0].cpu(), expected[0]) and torch.equal(got[1].cpu(), expected[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64])
def test_native_dropout_has_cpus_bits_and_strides(dtype):
    # openreg applies the mask in one pass (csrc/kernels/Dropout.cpp); CPU
    # multiplies twice. Signed zeros, inf and NaN included.
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 0.0, -3.0, 1e-3, 7.5])
    base = torch.cat([special, torch.randn(56)]).to(dtype)
    layouts = [lambda t: t.reshape(8, 8), lambda t: t.reshape(8, 8).t(), lambda t: t.reshape(8, 8)[:, ::2],
               lambda t: t.reshape(1, 4, 4, 4).contiguous(memory_format=torch.channels_last)]
    for layout in layouts:
        x, dx = layout(base), layout(base.to("openreg"))
        for p, train in [(0.3, True), (0.0, True), (1.0, True), (0.5, False), (0.5, None)]:
            torch.manual_seed(5)
            expected = torch.native_dropout(x, p, train)
            torch.manual_seed(5)
            got = torch.native_dropout(dx, p, train)
            for e, g in zip(expected, got):
                assert g.stride() == e.stride() and g.dtype == e.dtype
                bits = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
                assert torch.equal(bits(g.cpu()), bits(e)), (dtype, x.stride(), p, train)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_native_dropout_backward_has_cpus_bits(dtype):
    grad = torch.tensor([float("inf"), float("nan"), -0.0, -2.0, 3.0, 1e-4]).to(dtype)
    mask = torch.tensor([True, False, True, False, True, True])
    for g, m, scale in [(grad, mask, 1 / 0.7), (grad, mask, 0.0), (grad, mask, -2.0),
                        (grad.view(6, 1).expand(6, 3), mask.view(6, 1), 2.0),  # broadcast
                        (grad, mask.to(dtype), 1.5)]:  # a mask of another dtype
        expected = torch.ops.aten.native_dropout_backward(g, m, scale)
        got = torch.ops.aten.native_dropout_backward(g.to("openreg"), m.to("openreg"), scale)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got.cpu().contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)), (
            dtype, scale)


def test_dropout_backward_scales_the_gradient_by_the_mask():
    x = torch.randn(50, device="openreg", requires_grad=True)
    y = torch.nn.functional.dropout(x, 0.25)
    y.backward(torch.ones_like(y))
    kept = (y != 0).cpu()
    expected = kept.float() / 0.75
    torch.testing.assert_close(x.grad.cpu(), expected)
    assert torch.equal(
        torch.ops.aten.native_dropout_backward(torch.ones(4, device="openreg"), kept[:4].to("openreg"), 2.0).cpu(),
        kept[:4].float() * 2.0,
    )


def test_dropout_zeroes_and_rescales_like_cpu():
    out = torch.nn.functional.dropout(torch.ones(100, device="openreg"), 0.5).cpu()
    assert set(out.unique().tolist()) == {0.0, 2.0}  # kept values scaled by 1 / (1 - p)
    assert torch.equal(torch.nn.functional.dropout(torch.ones(4, device="openreg"), 0.5, training=False).cpu(), torch.ones(4))


# --- get_rng_state / set_rng_state ----------------------------------------------


def test_get_rng_state_is_a_cpu_byte_tensor_copy():
    state = torch.openreg.get_rng_state()
    assert state.dtype == torch.uint8 and state.device == torch.device("cpu") and state.dim() == 1
    snapshot = state.clone()
    draw()
    assert torch.equal(state, snapshot)  # drawing does not change a state already taken
    assert not torch.equal(torch.openreg.get_rng_state(), snapshot)


@pytest.mark.parametrize(
    "device",
    [1, "openreg:1", torch.device("openreg", 1), "openreg", torch.device("openreg")],
    ids=["int", "str", "torch.device", "str-current", "torch.device-current"],
)
def test_set_rng_state_replays_the_stream_for_every_device_form(device):
    torch.openreg.set_device(1)  # so that the index-less forms mean openreg:1
    torch.openreg.manual_seed_all(0)
    state = torch.openreg.get_rng_state(device)
    assert torch.equal(state, torch.openreg.default_generators[1].get_state())
    expected = draw(device="openreg:1")
    torch.openreg.set_rng_state(state, device)
    assert torch.equal(draw(device="openreg:1"), expected)


def test_rng_state_default_device_is_the_current_device():
    torch.openreg.default_generators[0].manual_seed(1)
    torch.openreg.default_generators[1].manual_seed(2)
    assert torch.equal(torch.openreg.get_rng_state(), torch.openreg.get_rng_state(0))
    torch.openreg.set_device(1)
    assert torch.equal(torch.openreg.get_rng_state(), torch.openreg.get_rng_state(1))
    assert not torch.equal(torch.openreg.get_rng_state(0), torch.openreg.get_rng_state(1))


def test_set_rng_state_changes_only_its_device():
    torch.openreg.manual_seed_all(0)
    state0 = torch.openreg.get_rng_state(0)
    new_state = seeded(77).get_state()
    torch.openreg.set_rng_state(new_state, 1)
    assert torch.equal(torch.openreg.get_rng_state(1), new_state)
    assert torch.equal(torch.openreg.get_rng_state(0), state0)


def test_set_rng_state_copies_the_state_and_accepts_a_non_contiguous_one():
    torch.openreg.manual_seed(5)
    state = torch.openreg.get_rng_state()
    expected = draw()
    strided = torch.stack([state, torch.zeros_like(state)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    torch.openreg.set_rng_state(strided)
    strided.zero_()  # the generator took a copy
    assert torch.equal(draw(), expected)


@pytest.mark.parametrize(
    "device, error, match",
    [
        ("cpu", ValueError, "expected an openreg device, got cpu"),
        (torch.device("cpu"), ValueError, "expected an openreg device"),
        (N_DEVICES, RuntimeError, f"device index is out of range: openreg:{N_DEVICES}"),
        (f"openreg:{N_DEVICES}", RuntimeError, "out of range"),
        (-1, RuntimeError, "must not be negative"),
        (1.0, TypeError, "got float"),
    ],
)
def test_rng_state_functions_reject_a_bad_device(device, error, match):
    with pytest.raises(error, match=match):
        torch.openreg.get_rng_state(device)
    with pytest.raises(error, match=match):
        torch.openreg.set_rng_state(torch.openreg.get_rng_state(0), device)


def test_set_rng_state_rejects_a_state_of_the_wrong_size():
    with pytest.raises(RuntimeError, match="size"):
        torch.openreg.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_set_rng_state_refuses_an_offset_it_would_take_minutes_to_reach():
    """The Mersenne Twister moves draw by draw: an offset beyond 2^35 pairs raises
    at once instead of seeming to hang, and leaves the state as it was."""
    torch.openreg.manual_seed(5)
    torch.rand(3, device="openreg")
    before = torch.openreg.get_rng_state()
    far = torch.tensor([5, 1 << 40], dtype=torch.int64).view(torch.uint8)
    with pytest.raises(ValueError, match="too far"):
        torch.openreg.set_rng_state(far)
    assert torch.equal(torch.openreg.get_rng_state(), before)
    torch.openreg.set_rng_state(torch.tensor([5, 1 << 20], dtype=torch.int64).view(torch.uint8))
    assert seed_and_draws(torch.openreg.get_rng_state()) == (5, 1 << 21)


def test_rng_state_is_the_seed_and_the_position_in_the_seeds_cpu_stream():
    # CUDA's layout (seed, offset), which DTensor's OffsetBasedRNGTracker reads and moves;
    # the offset counts pairs of CPU draws, an odd one in ODD_DRAW_BIT.
    torch.openreg.manual_seed(3)
    state = torch.openreg.get_rng_state()
    assert state.numel() == 16 and seed_and_draws(state) == (3, 0)
    torch.rand(5, device="openreg")
    assert seed_and_draws(torch.openreg.get_rng_state()) == (3, 5)
    assert torch.openreg.get_rng_state()[8:].view(torch.int64).item() == 2 | ODD_DRAW_BIT
    torch.rand(10_001, device="openreg", dtype=torch.float64)  # two draws each, many blocks of 624
    state = torch.openreg.get_rng_state()
    assert seed_and_draws(state) == (3, 5 + 20_002)
    torch.manual_seed(3)
    torch.rand(5)
    torch.rand(10_001, dtype=torch.float64)
    assert torch.equal(as_cpu_state(state), torch.get_rng_state())


@pytest.mark.parametrize("draws", [0, 1, 623, 624, 625, 5000])
def test_set_rng_state_at_a_moved_offset_draws_cpus_numbers_from_there(draws):
    state = torch.tensor([7, draws // 2 | (ODD_DRAW_BIT if draws % 2 else 0)], dtype=torch.int64).view(torch.uint8)
    torch.openreg.set_rng_state(state)
    assert torch.equal(torch.openreg.get_rng_state(), state)
    cpu = torch.Generator().manual_seed(7)
    torch.empty(draws).uniform_(generator=cpu)  # one CPU draw per float32
    assert torch.equal(torch.rand(8, device="openreg").cpu(), torch.rand(8, generator=cpu))
    assert seed_and_draws(torch.openreg.get_rng_state()) == (7, draws + 8)


def test_set_rng_state_rejects_a_negative_offset():
    with pytest.raises(RuntimeError, match="offset must not be negative"):
        torch.openreg.set_rng_state(torch.tensor([1, -2], dtype=torch.int64).view(torch.uint8))


def test_a_cached_normal_sample_keeps_cpus_layout_and_replays_exactly():
    # CPU's normal_ of an odd number of values below 16 keeps the second Box-Muller
    # value for the next draw: no (seed, offset) holds it, so the state is the CPU
    # generator's own.
    torch.manual_seed(0)
    torch.randn(3, device="openreg")
    state = torch.openreg.get_rng_state()
    torch.randn(3)
    assert torch.equal(state, torch.get_rng_state())
    expected = torch.randn(5, device="openreg").cpu()
    torch.openreg.set_rng_state(state)
    assert torch.equal(torch.randn(5, device="openreg").cpu(), expected)
    assert torch.equal(expected, torch.randn(5))
    assert torch.openreg.get_rng_state().numel() == state.numel()  # CPU's layout until reseeded
    torch.openreg.manual_seed(0)
    assert torch.openreg.get_rng_state().numel() == 16


def test_rng_state_all_round_trip_restores_every_device():
    states = torch.openreg.get_rng_state_all()
    assert len(states) == N_DEVICES
    assert all(torch.equal(s, torch.openreg.get_rng_state(i)) for i, s in enumerate(states))
    a = [draw(device=f"openreg:{i}") for i in range(N_DEVICES)]
    torch.openreg.set_rng_state_all(iter(states))  # any iterable, as torch.cuda
    assert all(torch.equal(draw(device=f"openreg:{i}"), a[i]) for i in range(N_DEVICES))


def test_set_rng_state_all_rejects_a_state_count_other_than_the_device_count():
    states = torch.openreg.get_rng_state_all()
    with pytest.raises(ValueError, match=f"1 states for {N_DEVICES} openreg devices"):
        torch.openreg.set_rng_state_all(states[:1])
    with pytest.raises(ValueError, match=f"{N_DEVICES + 1} states"):
        torch.openreg.set_rng_state_all([*states, states[0]])


# --- torch.random.fork_rng -----------------------------------------------------


def test_fork_rng_restores_openreg_states_on_exit():
    torch.manual_seed(8)
    expected = [draw(device=f"openreg:{i}") for i in range(N_DEVICES)]
    torch.manual_seed(8)
    with torch.random.fork_rng(devices=range(N_DEVICES), device_type="openreg"):
        inside = [draw(device=f"openreg:{i}") for i in range(N_DEVICES)]
        torch.manual_seed(99)
        draw(device="openreg:1")
    assert all(torch.equal(x, y) for x, y in zip(inside, expected))  # forked from the outer state
    assert all(torch.equal(draw(device=f"openreg:{i}"), expected[i]) for i in range(N_DEVICES))


def test_fork_rng_restores_openreg_states_when_the_block_raises():
    before = torch.openreg.get_rng_state_all()
    with pytest.raises(KeyError):
        with torch.random.fork_rng(devices=[0, 1], device_type="openreg"):
            torch.openreg.manual_seed_all(1)
            raise KeyError
    assert all(torch.equal(a, b) for a, b in zip(torch.openreg.get_rng_state_all(), before))


def test_fork_rng_defaults_to_openreg_as_the_current_accelerator():
    assert torch.accelerator.current_accelerator() == torch.device("openreg")
    before = torch.openreg.get_rng_state_all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "OPENREG reports that you have 2 available devices"
        with torch.random.fork_rng():
            torch.openreg.manual_seed_all(1)
    assert all(torch.equal(a, b) for a, b in zip(torch.openreg.get_rng_state_all(), before))


def test_fork_rng_leaves_devices_it_was_not_given_alone():
    torch.openreg.manual_seed_all(2)
    with torch.random.fork_rng(devices=[0], device_type="openreg"):
        draw(device="openreg:0")
        draw(device="openreg:1")
    after = torch.openreg.get_rng_state_all()
    torch.openreg.manual_seed_all(2)
    assert torch.equal(after[0], torch.openreg.get_rng_state(0))  # restored
    assert not torch.equal(after[1], torch.openreg.get_rng_state(1))  # kept its advance


# --- the torch.openreg.random module ----------------------------------------------


def test_random_module_is_torch_openreg_random():
    import torch_openreg.openreg.random

    assert isinstance(torch.openreg.random, types.ModuleType)
    assert torch.openreg.random is torch_openreg.openreg.random
    assert torch.openreg.random.__doc__


def test_random_module_exports_torch_cuda_random_api_on_torch_openreg():
    names = set(torch.openreg.random.__all__)
    assert set(torch.cuda.random.__all__) | {"default_generators"} == names
    for name in names:
        assert getattr(torch.openreg, name) is getattr(torch.openreg.random, name)
        assert name in torch.openreg.__all__


@pytest.mark.parametrize("name", sorted(torch.cuda.random.__all__))
def test_random_functions_take_torch_cuda_parameters_and_are_documented(name):
    ours = inspect.signature(getattr(torch.openreg.random, name))
    cudas = inspect.signature(getattr(torch.cuda.random, name))
    assert list(ours.parameters) == list(cudas.parameters)
    for param in ours.parameters.values():
        default = cudas.parameters[param.name].default
        assert param.default == (default.replace("cuda", "openreg") if isinstance(default, str) else default)
    assert inspect.getdoc(getattr(torch.openreg.random, name))


# --- the same numbers as CPU -----------------------------------------------------

SAME_STREAM = {
    "uniform_": lambda x: x.uniform_(),
    "uniform_(-2, 3)": lambda x: x.uniform_(-2, 3),
    "random_": lambda x: x.random_(),
    "random_(5, 90)": lambda x: x.random_(5, 90),
    "random_(100)": lambda x: x.random_(100),
    "random_ full int64 range": lambda x: x.random_(-(2**63), None),
    "normal_": lambda x: x.normal_(1.0, 2.0),
    "bernoulli_": lambda x: x.bernoulli_(0.3),
}
SAME_STREAM_DTYPES = {
    "uniform_": (torch.float32, torch.float64, torch.bfloat16, torch.float16),
    "uniform_(-2, 3)": (torch.float32, torch.float64),
    "random_": (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool, torch.bfloat16),
    "random_(5, 90)": (torch.float32, torch.int64, torch.int16),
    "random_(100)": (torch.float64, torch.int32),
    "random_ full int64 range": (torch.int64, torch.float64),
    "normal_": (torch.float32, torch.float64, torch.bfloat16, torch.float16),
    "bernoulli_": (torch.float32, torch.int64),
}


@pytest.mark.parametrize(
    "name, dtype", [(n, d) for n in SAME_STREAM for d in SAME_STREAM_DTYPES[n]], ids=str
)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_random_ops_draw_cpus_numbers_for_the_same_seed(name, dtype, layout):
    def draw(device):
        torch.manual_seed(7)
        x = torch.zeros(37, 3, dtype=dtype, device=device)
        SAME_STREAM[name](x if layout == "contiguous" else x.t())
        return x.cpu()

    assert torch.equal(draw("openreg"), draw("cpu"))


# On a contiguous tensor, uniform_ over [0, 1), random_(), bernoulli_(p) (where
# CPU's kernel is not MKL's) and normal_ (16 or more elements) fill it on kernel
# addresses in memory order; normal_ in blocks of 16,
# redrawing the last 16 when the size is not a multiple, with the transform CPU's
# kernel uses on this machine. Other tensors take torch's implementation. Each
# must give CPU's numbers, also at an offset into the storage.
FILLS = {
    "normal_": (lambda x: x.normal_(-0.5, 4.0), (torch.float32, torch.float64, torch.bfloat16, torch.float16)),
    "uniform_": (lambda x: x.uniform_(), (torch.float32, torch.float64, torch.bfloat16, torch.float16)),
    "random_": (lambda x: x.random_(), (torch.float32, torch.float16, torch.int8, torch.int16, torch.uint8, torch.bool)),
    "bernoulli_": (lambda x: x.bernoulli_(0.3), (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool)),
}


@pytest.mark.parametrize("name, dtype", [(n, d) for n, (_, dtypes) in FILLS.items() for d in dtypes], ids=str)
@pytest.mark.parametrize("numel", [1, 15, 16, 33, 1000])
@pytest.mark.parametrize("offset", [0, 5])
def test_fills_draw_cpus_numbers_for_every_size(name, dtype, numel, offset):
    def draw(device):
        torch.manual_seed(11)
        x = torch.zeros(offset + numel, dtype=dtype, device=device)
        FILLS[name][0](x[offset:])
        return x.cpu()

    assert torch.equal(draw("openreg"), draw("cpu"))


def test_uniform_in_bfloat16_turns_values_rounded_up_to_one_into_zero_as_cpu():
    # About 1 in 512 float draws rounds up to 1 in bfloat16; CPU's kernel returns 0.
    def draw(device):
        torch.manual_seed(5)
        return torch.empty(1 << 15, dtype=torch.bfloat16, device=device).uniform_().cpu()

    cpu = draw("cpu")
    assert (cpu == 0).sum() > 10
    assert torch.equal(draw("openreg"), cpu)


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_bernoulli_with_p_outside_0_1_raises_cpus_error(p):
    x = torch.zeros(32, device="openreg")
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\]"):
        x.bernoulli_(p)
    assert x.bernoulli_(1.0).eq(1).all()


def test_random_of_a_dtype_cpu_does_not_draw_raises_cpus_error():
    with pytest.raises(RuntimeError, match="not implemented for 'UInt16'"):
        torch.empty(4, dtype=torch.uint16).random_()
    with pytest.raises(RuntimeError, match="not implemented for 'UInt16'"):
        torch.empty(4, dtype=torch.uint16, device="openreg").random_()
    assert torch.empty(4, device="openreg").random_().isfinite().all()


NORMAL_UNDER_CAPABILITY = """
    import torch
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for numel in (16, 40):
            torch.manual_seed(3)
            cpu = torch.empty(numel, dtype=dtype).normal_(1.0, 2.0)
            torch.manual_seed(3)
            dev = torch.empty(numel, dtype=dtype, device="openreg").normal_(1.0, 2.0).cpu()
            assert torch.equal(cpu, dev), (torch.backends.cpu.get_cpu_capability(), dtype, numel, cpu, dev)
    print(torch.backends.cpu.get_cpu_capability())
"""


# CPU's normal_ kernel differs between the vector builds torch picks from
# (ATEN_CPU_CAPABILITY chooses one); openreg's must follow whichever runs.
@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_normal_draws_cpus_numbers_under_each_cpu_capability(capability):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NORMAL_UNDER_CAPABILITY)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ATEN_CPU_CAPABILITY": capability},
    )
    assert result.returncode == 0, result.stderr
