"""A per-tensor format tag: openreg's example of backend metadata on tensors.

A backend keeps what it knows about a tensor beyond sizes, strides and dtype
(a real accelerator: the physical layout of its data, such as a blocked
format) in the tensor's ``c10::BackendMeta`` (csrc/operators/OpenRegTensorFormat.h),
and PyTorch carries it where it carries the tensor if the backend says how:

- ``torch.save`` / ``torch.load`` and ``torch._utils.get_tensor_metadata`` /
  ``set_tensor_metadata`` through ``torch::jit::TensorBackendMetaRegistry``
  (registered by csrc/python/Module.cpp), as ``{"openreg.format.<name>": True}``;
- shallow copies of the tensor (``detach()``, ``nn.Parameter``,
  ``param.data = t``, ``Module.to``) by TensorImpl itself;
- copies of its data (``copy_`` into an untagged tensor, ``.to("openreg:1")``,
  ``clone()``) by openreg's ``_copy_from``, and ``copy.deepcopy`` by openreg's
  ``new_empty``;
- fake tensors (``torch.compile``, ``torch.export``) by openreg's fake tensor
  conversion (``_fake_tensor.py``).

openreg's kernels do not read the tag, and results of other operators do not
carry it. docs/integration/device.md says where it travels.
"""

from __future__ import annotations

import torch

from torch_openreg import _C

__all__ = ["set_tensor_format", "tensor_format"]


def tensor_format(tensor: torch.Tensor) -> str | None:
    """The format tag of ``tensor``, or None."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor_format expects a tensor, got {type(tensor).__name__}")
    return _C._tensor_format(tensor)


def set_tensor_format(tensor: torch.Tensor, format: str | None) -> None:
    """Tags the openreg ``tensor`` with ``format`` (letters, digits, underscores), or removes its tag."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"set_tensor_format expects a tensor, got {type(tensor).__name__}")
    if format is not None and not isinstance(format, str):
        raise TypeError(f"set_tensor_format expects a str or None as format, got {type(format).__name__}")
    _C._set_tensor_format(tensor, format)
