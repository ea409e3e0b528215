"""The required PrivateUse1 operator set, each checked against CPU."""

import pytest
import torch
from torch.testing import assert_close

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

DEV = "openreg"


def test_empty_allocates_on_requested_device_with_dtype_and_shape():
    for device in ("openreg", "openreg:0", "openreg:1"):
        t = torch.empty(2, 3, dtype=torch.float64, device=device)
        assert t.shape == (2, 3) and t.dtype == torch.float64
        assert t.device == torch.device("openreg:1" if device.endswith("1") else "openreg:0")
        assert t.is_contiguous()


def test_empty_honours_channels_last():
    t = torch.empty(2, 3, 4, 5, device=DEV, memory_format=torch.channels_last)
    ref = torch.empty(2, 3, 4, 5, memory_format=torch.channels_last)
    assert t.stride() == ref.stride()
    assert t.is_contiguous(memory_format=torch.channels_last)


def test_empty_zero_size():
    t = torch.empty(0, 4, device=DEV)
    assert t.shape == (0, 4) and t.numel() == 0
    assert t.cpu().shape == (0, 4)


def test_empty_strided_keeps_strides():
    t = torch.empty_strided((2, 3), (1, 2), device=DEV)
    assert t.stride() == (1, 2)
    t.copy_(torch.arange(6.0).reshape(2, 3))
    assert_close(t.cpu(), torch.arange(6.0).reshape(2, 3))


def test_factory_follows_current_device():
    with torch.openreg.device(1):
        assert torch.empty(1, device=DEV).device == torch.device("openreg:1")
    assert torch.empty(1, device=DEV).device == torch.device("openreg:0")


def test_as_strided_is_a_view_that_aliases():
    base = torch.arange(12.0, device=DEV)
    v = base.as_strided((3, 2), (4, 1), 1)
    assert_close(v.cpu(), torch.arange(12.0).as_strided((3, 2), (4, 1), 1))
    v.fill_(-1)
    expected = torch.arange(12.0)
    expected.as_strided((3, 2), (4, 1), 1).fill_(-1)
    assert_close(base.cpu(), expected)


def test_view_aliases_base():
    base = torch.zeros(2, 6, device=DEV)
    v = base.view(3, 4)
    assert v._base is base and v.data_ptr() == base.data_ptr()
    v[1, 1] = 5
    assert base.cpu()[0, 5].item() == 5


def test_view_rejects_incompatible_strides_like_cpu():
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        torch.zeros(4, 6, device=DEV).t().view(24)


def test_reshape_alias_of_noncontiguous_view():
    cpu = torch.arange(24.0).reshape(2, 3, 4)[:, :, ::2]
    dev = torch.arange(24.0, device=DEV).reshape(2, 3, 4)[:, :, ::2]
    r_cpu = torch.ops.aten._reshape_alias(cpu, (6, 2), (4, 2))
    r_dev = torch.ops.aten._reshape_alias(dev, (6, 2), (4, 2))
    assert r_dev.stride() == r_cpu.stride()
    assert_close(r_dev.cpu(), r_cpu)
    r_dev.zero_()
    assert dev.sum().item() == 0


def test_resize_grows_and_keeps_existing_values():
    t = torch.arange(4.0, device=DEV)
    t.resize_(2, 4)
    assert t.shape == (2, 4)
    assert_close(t.cpu().flatten()[:4], torch.arange(4.0))


def test_resize_shrinks_and_to_zero():
    t = torch.arange(6.0, device=DEV)
    t.resize_(2)
    assert_close(t.cpu(), torch.tensor([0.0, 1.0]))
    t.resize_(0)
    assert t.numel() == 0


def test_resize_with_memory_format():
    t = torch.empty(0, device=DEV).resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    assert t.is_contiguous(memory_format=torch.channels_last)


def test_resize_rejects_negative_sizes():
    with pytest.raises(RuntimeError, match="negative dimension"):
        torch.empty(2, device=DEV).resize_(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64, torch.bfloat16])
def test_copy_host_device_round_trip(dtype):
    cpu = torch.testing.make_tensor((5, 7), dtype=dtype, device="cpu")
    dev = cpu.to(DEV)
    assert dev.device.type == "openreg" and dev.dtype == dtype
    assert_close(dev.cpu(), cpu)


def test_copy_noncontiguous_both_directions():
    cpu = torch.randn(6, 8)[:, ::3].t()
    dev = cpu.to(DEV)
    assert_close(dev.cpu(), cpu)
    target = torch.zeros(8, 6, device=DEV).t()[::2]
    src = torch.randn(3, 8)
    target.copy_(src)
    assert_close(target.cpu(), src)
    back = torch.zeros(3, 8).t()
    back.copy_(target.t())
    assert_close(back, src.t())


def test_copy_converts_dtype_each_direction():
    src = torch.tensor([1.7, -2.2, 3.9])
    assert_close(src.to(DEV, torch.int32).cpu(), src.to(torch.int32))
    dev = torch.tensor([1, 2, 3], device=DEV)
    out = torch.empty(3, dtype=torch.float64)
    out.copy_(dev)
    assert_close(out, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    d2 = torch.empty(3, dtype=torch.float16, device=DEV)
    d2.copy_(dev)
    assert_close(d2.cpu(), torch.tensor([1, 2, 3], dtype=torch.float16))


def test_copy_broadcasts_source():
    dst = torch.zeros(3, 4, device=DEV)
    dst.copy_(torch.arange(4.0))
    assert_close(dst.cpu(), torch.arange(4.0).expand(3, 4))


def test_copy_device_to_device_same_device():
    a = torch.randn(4, 5, device=DEV)
    b = torch.empty(4, 5, device=DEV)
    b.copy_(a)
    assert_close(b.cpu(), a.cpu())
    assert b.data_ptr() != a.data_ptr()


def test_copy_refuses_overlaps_as_cpu_does():
    # copy_ hands openreg copies to _copy_from before CPU's overlap checks run.
    def cases(device):
        t = torch.arange(16.0, device=device)
        yield "partial", lambda: t[1:].copy_(t[:-1])
        yield "partial strided", lambda: t[1:9].copy_(t[::2])
        yield "internal", lambda: torch.zeros(1, device=device).expand(4).copy_(torch.arange(4.0, device=device))
        yield "same data", lambda: t.copy_(t.view(4, 4).view(16))
        yield "full overlap, other dtype", lambda: t.view(torch.int32).copy_(t)
    for (name, on_cpu), (_, on_dev) in zip(cases("cpu"), cases(DEV)):
        try:
            expected = on_cpu()
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match=r"unsupported operation: (some|more than one) element"):
                on_dev()
            assert "unsupported operation" in str(e), name
            continue
        assert_close(on_dev().cpu(), expected, msg=name)


@pytest.mark.parametrize("nbytes", [(512 << 10) - 4, 512 << 10, (1 << 20) + 4, 9 << 20])
def test_large_copies_in_every_direction(nbytes):
    # Around and above the size from which the runtime's copy engine stops
    # using memmove (csrc/runtime/RuntimeMemory.cpp: copy_bytes).
    src = torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), dtype=torch.int32)
    dev = src.to(DEV)
    assert torch.equal(dev.cpu(), src)
    twice = torch.empty(2 * src.numel(), dtype=torch.int32, device=DEV)
    twice[src.numel():].copy_(dev)  # within one allocation, no overlap
    twice[: src.numel()].copy_(twice[src.numel():])
    assert torch.equal(twice.cpu(), src.repeat(2))
    other = dev.to("openreg:1")
    assert torch.equal(other.cpu(), src)
    pinned = torch.empty_like(src).pin_memory()
    pinned.copy_(dev, non_blocking=True)
    back = torch.empty_like(dev)
    back.copy_(pinned, non_blocking=True)
    torch.openreg.synchronize()
    assert torch.equal(pinned, src) and torch.equal(back.cpu(), src)


def test_copy_across_devices_keeps_values_and_device():
    a = torch.randn(3, 3, device="openreg:0")
    b = a.to("openreg:1")
    assert b.device == torch.device("openreg:1")
    assert_close(b.cpu(), a.cpu())
    c = torch.zeros(3, 3, device="openreg:0")
    c.copy_(b.t())
    assert_close(c.cpu(), a.cpu().t())


def test_copy_resolves_conjugate_and_negative_views():
    z = torch.randn(4, dtype=torch.complex64)
    assert_close(z.conj().to(DEV).cpu(), z.conj().resolve_conj())
    dz = z.to(DEV)
    assert_close(dz.conj().cpu(), z.conj())
    out = torch.empty(4, dtype=torch.complex64, device=DEV)
    out.copy_(dz.conj())
    assert_close(out.cpu(), z.conj().resolve_conj())


def test_copy_from_and_resize_resizes_destination():
    src = torch.arange(6.0, device=DEV).reshape(2, 3)
    dst = torch.empty(0, device=DEV)
    torch._copy_from_and_resize(src, dst)
    assert dst.shape == (2, 3)
    assert_close(dst.cpu(), src.cpu())
    host = torch.empty(0)
    torch._copy_from_and_resize(src, host)
    assert_close(host, src.cpu())


@pytest.mark.parametrize("value", [3, -2.5, True, 1 + 2j])
def test_item_returns_python_scalar(value):
    t = torch.tensor(value, device=DEV)
    assert t.item() == value
    assert type(t.item()) is type(value)


def test_item_of_view_reads_the_right_element():
    t = torch.arange(10, device=DEV)[3:]
    assert t[2].item() == 5


def test_set_source_tensor_shares_storage():
    src = torch.arange(6.0, device=DEV).reshape(2, 3)
    t = torch.empty(0, device=DEV)
    t.set_(src)
    assert t.shape == (2, 3) and t.data_ptr() == src.data_ptr()
    t[0, 0] = 42
    assert src[0, 0].item() == 42


def test_set_source_storage_views_whole_storage():
    src = torch.arange(5.0, device=DEV)
    t = torch.empty(0, device=DEV)
    t.set_(src.untyped_storage())
    assert t.shape == (5,)
    assert_close(t.cpu(), torch.arange(5.0))


def test_set_source_storage_with_offset_and_strides():
    src = torch.arange(12.0, device=DEV)
    t = torch.empty(0, device=DEV)
    t.set_(src.untyped_storage(), 2, (2, 3), (4, 1))
    assert_close(t.cpu(), torch.arange(12.0).as_strided((2, 3), (4, 1), 2))


def test_set_storage_grows_a_too_small_storage():
    t = torch.empty(0, device=DEV)
    storage = torch.empty(2, device=DEV).untyped_storage()
    t.set_(storage, 0, (4,), (1,))
    assert t.untyped_storage().nbytes() >= 16


def test_set_rejects_storage_of_other_device():
    t = torch.empty(0, device="openreg:0")
    other = torch.empty(3, device="openreg:1").untyped_storage()
    with pytest.raises(RuntimeError, match="devices must match"):
        t.set_(other, 0, (3,), (1,))


def test_set_empty_gives_empty_tensor_on_same_device():
    t = torch.ones(3, device="openreg:1")
    t.set_()
    assert t.numel() == 0 and t.device == torch.device("openreg:1")


def test_storage_resize_keeps_bytes():
    t = torch.arange(4, dtype=torch.uint8, device=DEV)
    s = t.untyped_storage()
    s.resize_(8)
    assert s.nbytes() == 8
    assert torch.empty(0, dtype=torch.uint8, device=DEV).set_(s)[:4].cpu().tolist() == [0, 1, 2, 3]


def test_zero_size_copies_in_every_direction():
    empty_cpu = torch.empty(0, 3)
    dev = empty_cpu.to(DEV)
    assert dev.shape == (0, 3) and dev.device.type == "openreg"
    assert dev.to("openreg:1").shape == (0, 3)
    assert dev.cpu().shape == (0, 3)


def test_zero_size_views_and_resize():
    t = torch.empty(0, device=DEV)
    assert t.view(0, 5).shape == (0, 5)
    assert t.as_strided((0, 2), (2, 1)).shape == (0, 2)
    t.resize_(3)
    t.fill_(1.5)
    assert t.cpu().tolist() == [1.5, 1.5, 1.5]
