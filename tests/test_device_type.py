"""Device-generic tests in torch's own style, instantiated for openreg.

torch's test suite writes a test once, with a `device` argument, and
`instantiate_device_type_tests` makes one class per device type; for a
PrivateUse1 backend the base is `PrivateUse1TestBase`, which reads the device
name and module from torch (torch.openreg) and the device count for
`@deviceCountAtLeast`. These tests are written that way, with torch's decorators
(`@dtypes`, `@deviceCountAtLeast`, `@onlyPRIVATEUSE1`) and `TestCase.assertEqual`,
so they run unchanged on any device type torch knows.
"""

import torch
from torch.testing import make_tensor
from torch.testing._internal.common_device_type import (
    deviceCountAtLeast,
    dtypes,
    instantiate_device_type_tests,
    onlyPRIVATEUSE1,
)
from torch.testing._internal.common_dtype import all_types_and_complex_and
from torch.testing._internal.common_utils import DeterministicGuard, TestCase

MODES = ()  # the extra CI passes that run this file (tests/conftest.py)

ALL_DTYPES = all_types_and_complex_and(torch.half, torch.bfloat16, torch.bool)


class TestDeviceGeneric(TestCase):
    @dtypes(*ALL_DTYPES)
    def test_factories_match_cpu(self, device, dtype):
        for factory in (torch.zeros, torch.ones, torch.empty):
            t = factory((2, 3), device=device, dtype=dtype)
            self.assertEqual(t.device.type, self.device_type)
            self.assertEqual((t.shape, t.dtype), (torch.Size([2, 3]), dtype))
        self.assertEqual(torch.zeros(2, 3, device=device, dtype=dtype), torch.zeros(2, 3, dtype=dtype), exact_device=False)
        self.assertEqual(torch.full((4,), 1, device=device, dtype=dtype), torch.full((4,), 1, dtype=dtype), exact_device=False)

    @dtypes(torch.float32, torch.complex64, torch.int64, torch.bool)
    def test_deterministic_mode_fills_new_memory_as_cpu_does(self, device, dtype):
        # Under torch.use_deterministic_algorithms(True), what empty() and a
        # growing resize_() hand out reads as NaN (the largest value for integers).
        def new_memory(on):
            return [torch.empty(3, dtype=dtype, device=on),
                    torch.empty_strided((2, 2), (1, 2), dtype=dtype, device=on),
                    torch.empty_like(torch.zeros(2, dtype=dtype, device=on)),
                    torch.zeros(2, dtype=dtype, device=on).resize_(5)]

        with DeterministicGuard(True):
            for got, expected in zip(new_memory(device), new_memory("cpu")):
                self.assertEqual(got, expected, exact_device=False)

    def test_efficient_zero_tensor_reads_as_zeros_and_owns_no_memory(self, device):
        before = torch.openreg.memory_allocated(device)
        z = torch._efficientzerotensor(3, 4, device=device)
        self.assertEqual((z.device.type, z.shape, z._is_zerotensor()), (self.device_type, torch.Size([3, 4]), True))
        self.assertEqual(torch.openreg.memory_allocated(device), before)
        self.assertEqual((z + torch.ones(3, 4, device=device)).cpu(), torch.ones(3, 4))
        # sgn's backward hands autograd a zero tensor for real inputs.
        x = torch.randn(5, device=device, requires_grad=True)
        torch.sgn(x).sum().backward()
        self.assertEqual(x.grad.cpu(), torch.zeros(5))

    @dtypes(*ALL_DTYPES)
    def test_copy_round_trip_keeps_values_and_strides(self, device, dtype):
        cpu = make_tensor((4, 5), dtype=dtype, device="cpu", noncontiguous=True)
        on_device = cpu.to(device)
        self.assertEqual(on_device.cpu(), cpu)
        transposed = on_device.t()
        self.assertEqual(transposed.cpu(), cpu.t())
        self.assertEqual(transposed.contiguous().stride(), cpu.t().contiguous().stride())

    @dtypes(*ALL_DTYPES)
    def test_dtype_conversion_matches_cpu(self, device, dtype):
        cpu = make_tensor((3, 4), dtype=dtype, device="cpu", low=-9, high=9)
        for target in (torch.float32, torch.int64, torch.bool, torch.complex64, torch.bfloat16):
            self.assertEqual(cpu.to(device).to(target), cpu.to(target), exact_device=False)

    @dtypes(torch.float32, torch.int64)
    def test_views_share_storage_and_see_writes(self, device, dtype):
        t = torch.zeros(4, 4, device=device, dtype=dtype)
        view = t[1:3, ::2]
        view.fill_(7)
        self.assertEqual(t.untyped_storage().data_ptr(), view.untyped_storage().data_ptr())
        expected = torch.zeros(4, 4, dtype=dtype)
        expected[1:3, ::2] = 7
        self.assertEqual(t, expected, exact_device=False)
        t.view(-1)[0] = 5
        self.assertEqual(t[0, 0].item(), 5)

    @dtypes(torch.float32, torch.float64, torch.complex64)
    def test_elementwise_and_reductions_match_cpu(self, device, dtype):
        a = make_tensor((8, 9), dtype=dtype, device="cpu", low=0.5, high=2)
        b = make_tensor((9,), dtype=dtype, device="cpu", low=0.5, high=2)
        da, db = a.to(device), b.to(device)
        self.assertEqual(da * db + da / db, a * b + a / b, exact_device=False)
        self.assertEqual(da.exp().sum(0), a.exp().sum(0), exact_device=False)
        self.assertEqual(da.sum(), a.sum(), exact_device=False)

    @dtypes(torch.float32)
    def test_indexing_matches_cpu(self, device, dtype):
        cpu = make_tensor((5, 6), dtype=dtype, device="cpu")
        t = cpu.to(device)
        index = torch.tensor([4, 0, 2])
        self.assertEqual(t[index], cpu[index], exact_device=False)
        self.assertEqual(t[index.to(device)], cpu[index], exact_device=False)
        self.assertEqual(t[t > 0], cpu[cpu > 0], exact_device=False)
        t[index] = 1.5
        cpu[index] = 1.5
        self.assertEqual(t, cpu, exact_device=False)

    @deviceCountAtLeast(2)
    def test_dlpack_exchanges_device_memory(self, devices):
        for index, device in enumerate(devices[:2]):
            x = torch.arange(6.0, device=device).view(2, 3).t()
            self.assertEqual(x.__dlpack_device__(), (torch.utils.dlpack.DLDeviceType.kDLExtDev, index))
            for y in (torch.from_dlpack(x), torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(x))):
                self.assertEqual((y.device, y.data_ptr(), y.stride()), (x.device, x.data_ptr(), x.stride()))
                y.add_(1)
            self.assertEqual(x, torch.arange(6.0).view(2, 3).t() + 2, exact_device=False)
        self.assertEqual(torch.ones(1).__dlpack_device__()[0], torch.utils.dlpack.DLDeviceType.kDLCPU)

    @deviceCountAtLeast(2)
    def test_copies_between_devices(self, devices):
        self.assertEqual(devices[0], self.get_primary_device())
        a = torch.arange(6.0, device=devices[0])
        b = a.to(devices[1])
        self.assertEqual(b.device, torch.device(devices[1]))
        self.assertEqual(b, a, exact_device=False)
        with self.assertRaisesRegex(RuntimeError, "Expected all tensors to be on the same device"):
            a + b

    @onlyPRIVATEUSE1
    def test_device_module_is_torch_openreg(self, device):
        self.assertIs(self.device_mod, torch.openreg)
        self.assertEqual(self.device_type, "openreg")
        self.assertEqual(torch.device(device).type, "openreg")


instantiate_device_type_tests(TestDeviceGeneric, globals(), only_for="openreg")
