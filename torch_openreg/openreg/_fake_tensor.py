"""What fake tensors must know about openreg: the strides of its convolutions and of its
attention kernels, and the tensors' backend metadata (torch_openreg/openreg/formats.py).

torch.compile, torch.export and AOTAutograd trace a program on fake tensors, and
every later step trusts the strides those predict: Inductor's generated wrapper
asserts them (``assert_size_stride``), and a graph that reshapes a convolution's
output into a view is only valid if the real output has the predicted layout.

The fake convolution (``conv`` in torch/_subclasses/fake_impls.py, registered for
``convolution``, ``_convolution`` and ``convolution_backward``) asks
``torch._C._select_conv_backend`` which kernel the device would run and takes
that kernel's memory format. For a PrivateUse1 tensor the answer is
``Overrideable``, whose format is always contiguous. But openreg's convolution is
CPU's, run on CPU aliases of the device memory (``convolution`` and
``convolution_backward`` under ``cpu_kernels:`` in backend_functions.yaml), so it
picks CPU's kernel, oneDNN's for float32, whose output is channels-last when an
operand is. The prediction was wrong for every channels-last convolution, as soon
as Inductor's layout optimisation or the user made one.

``register`` wraps the fake convolution so that for openreg operands it predicts
on CPU fake tensors of the same sizes and strides, as CPU's kernel selection sees
the CPU aliases, then moves the prediction to the openreg device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConverter, FakeTensorMode
from torch.fx.operator_schemas import normalize_function
from torch.utils._pytree import tree_map

aten = torch.ops.aten

# The operators fake_impls.conv predicts; openreg binds all of them to CPU's kernels.
_CONV_OPS = (
    aten.convolution.default,
    aten._convolution.default,
    aten._convolution.deprecated,
    aten.convolution_backward.default,
)
_CPU = torch.device("cpu")
_SDPA = aten._scaled_dot_product_fused_attention_overrideable.default
_SDPA_BACKWARD = aten._scaled_dot_product_fused_attention_overrideable_backward.default


def _on(fake_mode: FakeTensorMode, t: Any, device: torch.device) -> Any:
    """A fake tensor like ``t`` (sizes, strides, dtype) on ``device``; other values as they are."""
    if not isinstance(t, FakeTensor) or t.device == device:
        return t
    with fake_mode:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)


def _predicted_as_on_cpu(torch_conv: Any) -> Any:
    def conv(fake_mode: FakeTensorMode, func: Any, *args: Any, **kwargs: Any) -> Any:
        device = next(
            (t.device for t in (*args, *kwargs.values()) if isinstance(t, FakeTensor) and t.device.type == "openreg"),
            None,
        )
        if device is None:
            return torch_conv(fake_mode, func, *args, **kwargs)
        args, kwargs = tree_map(lambda t: _on(fake_mode, t, _CPU), (args, kwargs))
        return tree_map(lambda t: _on(fake_mode, t, device), torch_conv(fake_mode, func, *args, **kwargs))

    conv._openreg = True  # type: ignore[attr-defined]
    return conv


def _sdpa_as_on_cpu(fake_mode: FakeTensorMode, func: Any, *args: Any, **kwargs: Any) -> Any:
    """openreg's overrideable attention and its backward run CPU's flash attention
    (csrc/kernels/Attention.cpp), whose logsumexp and gradients are laid out
    otherwise than the Meta kernels predict: predicts them as on CPU, and the
    outputs openreg's kernels leave undefined as None."""
    a = normalize_function(func, args, kwargs, normalize_to_only_use_kwargs=True).kwargs
    device = a["query"].device
    cpu = {name: _on(fake_mode, a[name], _CPU) for name in ("query", "key", "value", "attn_bias")}
    if func is _SDPA:
        out, logsumexp = aten._scaled_dot_product_flash_attention_for_cpu(
            cpu["query"], cpu["key"], cpu["value"], a["dropout_p"], a["is_causal"], attn_mask=cpu["attn_bias"],
            scale=a["scale"])
        with fake_mode:
            seed, offset = torch.empty((), dtype=torch.long), torch.empty((), dtype=torch.long)
        return (_on(fake_mode, out, device), _on(fake_mode, logsumexp, device), None, None,
                a["query"].size(-2), a["key"].size(-2), seed, offset, None)
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _on(fake_mode, a["grad_out"], _CPU), cpu["query"], cpu["key"], cpu["value"], _on(fake_mode, a["out"], _CPU),
        _on(fake_mode, a["logsumexp"], _CPU), a["dropout_p"], a["is_causal"], attn_mask=cpu["attn_bias"],
        scale=a["scale"])
    return (*(_on(fake_mode, g, device) if wanted else None for g, wanted in zip(grads, a["grad_input_mask"])), None)


def _keeping_backend_metadata(from_real_tensor: Any) -> Any:
    def convert(self: FakeTensorConverter, fake_mode: FakeTensorMode, t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        fake = from_real_tensor(self, fake_mode, t, *args, **kwargs)
        if t.device.type == "openreg":
            metadata = torch._C._get_tensor_metadata(t)
            if metadata:
                torch._C._set_tensor_metadata(fake, metadata)
        return fake

    convert._openreg = True  # type: ignore[attr-defined]
    return convert


def register() -> None:
    """Makes the fake convolution and attention predict openreg's outputs as CPU's, and fake
    tensors of openreg tensors carry their backend metadata (the format tag)."""
    for op in _CONV_OPS:
        torch_conv = fake_impls.op_implementations_dict[op]
        if not getattr(torch_conv, "_openreg", False):
            fake_impls.op_implementations_dict[op] = _predicted_as_on_cpu(torch_conv)
    for op in (_SDPA, _SDPA_BACKWARD):
        fake_impls.op_implementations_dict[op] = _sdpa_as_on_cpu
    # meta_utils makes a fake tensor from sizes, strides and storage only;
    # c10::BackendMeta is not among what it copies.
    if not getattr(FakeTensorConverter.from_real_tensor, "_openreg", False):
        FakeTensorConverter.from_real_tensor = _keeping_backend_metadata(FakeTensorConverter.from_real_tensor)
