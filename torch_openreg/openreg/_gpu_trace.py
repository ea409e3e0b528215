"""Where c10's GPU trace reports openreg's streams, events and memory.

torch/csrc/PyInterpreter.cpp (CONCRETE_GPU_TRACE) answers each trace_gpu_*
hook of a device type by importing ``torch.<device type name>`` and calling
``_gpu_trace.<Name>Callbacks.fire_callbacks(...)`` there, so for PrivateUse1
renamed to openreg it looks up this module under the names torch.cuda's and
torch.xpu's have. csrc/device/OpenRegGpuTrace.h calls the hooks; nothing fires
until a tool calls ``torch._C._activate_gpu_trace()`` (the sanitizer does).

Streams are named by their runtime handle (``torch_openreg._C._stream_handle``)
and events by theirs (``torch.Event.event_id``); memory by the device address
the caching allocator hands a tensor's storage.
"""

from __future__ import annotations

from torch._utils import CallbackRegistry

# (event)
EventCreationCallbacks: CallbackRegistry = CallbackRegistry("openreg event creation")
EventDeletionCallbacks: CallbackRegistry = CallbackRegistry("openreg event deletion")
EventSynchronizationCallbacks: CallbackRegistry = CallbackRegistry("openreg event synchronization")
# (event, stream)
EventRecordCallbacks: CallbackRegistry = CallbackRegistry("openreg event record")
EventWaitCallbacks: CallbackRegistry = CallbackRegistry("openreg event wait")
# (data pointer)
MemoryAllocationCallbacks: CallbackRegistry = CallbackRegistry("openreg memory allocation")
MemoryDeallocationCallbacks: CallbackRegistry = CallbackRegistry("openreg memory deallocation")
# (stream)
StreamCreationCallbacks: CallbackRegistry = CallbackRegistry("openreg stream creation")
StreamSynchronizationCallbacks: CallbackRegistry = CallbackRegistry("openreg stream synchronization")
# ()
DeviceSynchronizationCallbacks: CallbackRegistry = CallbackRegistry("openreg device synchronization")
