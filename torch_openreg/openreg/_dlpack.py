"""DLPack's name for openreg's device.

``Tensor.__dlpack_device__`` (torch/_tensor.py) names a PrivateUse1 tensor's
device ``kDLExtDev`` only while the backend is called "privateuse1", which a
renamed backend never is: for openreg tensors it raises "Unknown device type
openreg for Dlpack", so ``torch.from_dlpack(tensor)`` and other libraries'
``from_dlpack`` refuse tensors that ``torch.utils.dlpack.to_dlpack`` exports
(as ``kDLExtDev`` and the device index) and ``from_dlpack`` imports.
``register`` answers for openreg tensors and leaves every other one to torch.
"""

from __future__ import annotations

import functools

import torch
from torch.overrides import has_torch_function_unary
from torch.utils.dlpack import DLDeviceType


def register() -> None:
    torch_dlpack_device = torch.Tensor.__dlpack_device__
    name = torch._C._get_privateuse1_backend_name()

    @functools.wraps(torch_dlpack_device)
    def __dlpack_device__(self: torch.Tensor) -> tuple[DLDeviceType, int]:
        if not has_torch_function_unary(self) and self.device.type == name:
            return DLDeviceType.kDLExtDev, self.device.index or 0
        return torch_dlpack_device(self)

    torch.Tensor.__dlpack_device__ = __dlpack_device__
