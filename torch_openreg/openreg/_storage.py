"""The legacy typed storage classes of torch.openreg (torch.openreg.FloatStorage, ...),
as torch.cuda has them: Tensor.storage_type() and TypedStorage's pickling look them up
on the device's module, and torch.storage gives a class the device its defining
module's last name part ("openreg") names."""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _dtype_to_storage_type_map, _LegacyStorage, _warn_typed_storage_removal

# Every dtype with a legacy storage class (torch.storage's own table), quantized
# ones (Q*Storage) aside: openreg has no quantized tensors.
_DTYPES = {name: dtype for dtype, name in _dtype_to_storage_type_map().items() if not name.startswith("Q")}


class _OpenRegLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: not available for openreg storage; make a CPU storage and move it")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: not available for openreg storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: not available for openreg storage")


def _dtype_property(dtype: torch.dtype, warn: bool) -> classproperty:
    def get(cls):
        if warn:
            _warn_typed_storage_removal()
        return dtype

    return classproperty(get)


def legacy_storage_classes(module: str) -> dict[str, type]:
    """One class per dtype, defined in `module` (which must end in ".openreg")."""
    return {
        name: type(name, (_OpenRegLegacyStorage,), {
            "__module__": module, "dtype": _dtype_property(dtype, True), "_dtype": _dtype_property(dtype, False)})
        for name, dtype in _DTYPES.items()
    }
