"""openreg as a device of TorchDynamo and Inductor (torch._dynamo.device_interface).

Dynamo and Inductor reach a device's runtime only through the DeviceInterface
registered for its type: to recognise ``torch.openreg.Stream`` / ``Event`` and
``torch.openreg.device(...)`` while tracing, to read device properties when
Inductor sizes reductions (``DeviceProperties.create``), and to set the device
in compile workers. This one wraps ``torch.openreg`` as ``CudaInterface`` wraps
``torch.cuda``.

``torch_openreg`` registers it when ``torch._dynamo.device_interface`` is first
imported (``torch_openreg._import_hooks``), not at ``import torch``: importing
dynamo costs about 1.5 s, and nothing can look the interface up before that
module exists.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import (
    DeviceInterface,
    caching_worker_current_devices,
    caching_worker_device_properties,
    register_interface_for_device,
)

import torch_openreg.openreg as openreg


class OpenRegInterface(DeviceInterface):
    device = openreg.device  # type: ignore[assignment]
    # torch.Event / torch.Stream subclasses, as dynamo requires to trace them.
    Event = openreg.Event  # type: ignore[assignment]
    Stream = openreg.Stream  # type: ignore[assignment]

    class Worker:
        """What compile workers may ask without touching the device: the
        properties recorded in the parent (``caching_device_properties``)."""

        @staticmethod
        def set_device(device: int) -> None:
            caching_worker_current_devices["openreg"] = device

        @staticmethod
        def current_device() -> int:
            if "openreg" in caching_worker_current_devices:
                return caching_worker_current_devices["openreg"]
            return openreg.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            index = (
                OpenRegInterface.Worker.current_device()
                if device is None
                else openreg._device_index(device)
            )
            if "openreg" not in caching_worker_device_properties:
                caching_worker_device_properties["openreg"] = [
                    openreg.get_device_properties(i) for i in range(openreg.device_count())
                ]
            return caching_worker_device_properties["openreg"][index]

    current_device = staticmethod(openreg.current_device)
    set_device = staticmethod(openreg.set_device)
    device_count = staticmethod(openreg.device_count)
    is_available = staticmethod(openreg.is_available)
    synchronize = staticmethod(openreg.synchronize)
    stream = staticmethod(openreg.stream)  # type: ignore[assignment]
    current_stream = staticmethod(openreg.current_stream)
    set_stream = staticmethod(openreg.set_stream)  # type: ignore[assignment]
    get_device_properties = staticmethod(openreg.get_device_properties)  # type: ignore[assignment]
    memory_allocated = staticmethod(openreg.memory_allocated)
    is_bf16_supported = staticmethod(openreg.is_bf16_supported)  # type: ignore[assignment]

    @staticmethod
    def exchange_device(device: int) -> int:
        """Makes ``device`` current and returns the previous one (torch.cuda._exchange_device)."""
        if device < 0:
            return -1
        previous = openreg.current_device()
        if previous != device:
            openreg.set_device(device)
        return previous

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return OpenRegInterface.exchange_device(device)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        openreg.set_stream(
            openreg.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)
        )

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        """The runtime handle of the current stream (what a cudaStream_t is to CUDA)."""
        return openreg.current_stream(device_idx).native_handle

    @staticmethod
    def get_compute_capability(device: Any = None) -> int:
        # As CudaInterface: major * 10 + minor. Inductor keys caches on it.
        major, minor = openreg.get_device_capability(device)
        return major * 10 + minor


def register(_module: object = None) -> None:
    """Registers ``OpenRegInterface`` for ``openreg`` and each ``openreg:N``, as
    ``init_device_reg`` does for CUDA."""
    register_interface_for_device("openreg", OpenRegInterface)
    for i in range(openreg.device_count()):
        register_interface_for_device(f"openreg:{i}", OpenRegInterface)
