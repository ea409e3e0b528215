// Reports stream, event and memory activity to c10's GPU trace
// (c10/core/impl/GPUTrace.h), the mechanism torch.cuda._sanitizer is built on.
// Once a Python tool calls torch._C._activate_gpu_trace(), each function below
// calls the PyInterpreter's trace_gpu_* hook with PrivateUse1, which
// torch/csrc/PyInterpreter.cpp (CONCRETE_GPU_TRACE) turns into
// torch.openreg._gpu_trace.<...>Callbacks.fire_callbacks(...)
// (torch_openreg/openreg/_gpu_trace.py); torch.openreg.sanitizer listens there.
//
// Streams are named by their runtime handle (orStream_t) and events by theirs
// (orEvent_t), as CUDA passes cudaStream_t / cudaEvent_t
// (c10/cuda/impl/CUDAGuardImpl.h); torch_openreg._C._stream_handle gives
// Python the same number for a torch.Stream.
//
// While no tool listens, each call is GPUTrace::get_trace(): a load of a
// flag and of an atomic pointer.
#pragma once

#include <cstdint>
#include <exception>

#include <c10/core/impl/GPUTrace.h>

#include "runtime/OpenRegRuntime.h"

namespace openreg::gpu_trace {

// The hook to call, or nullptr. Nothing is reported from inside a kernel: a
// kernel runs on a stream's worker thread, and the hook takes the GIL, which
// the thread waiting for that stream may hold. What a kernel allocates and
// frees inside itself (CPU kernels' temporaries) is no tensor of the program.
// Nor while an exception unwinds the stack (tensors freed on the way): when it
// is a python_error the Python error is still set, and the hook's Python call
// would fail with a SystemError in its place.
inline const c10::impl::PyInterpreter* listener() {
  const c10::impl::PyInterpreter* interp = c10::impl::GPUTrace::get_trace();
  if (C10_LIKELY(interp == nullptr) || orInsideKernel() || std::uncaught_exceptions() > 0) {
    return nullptr;
  }
  return interp;
}

inline uintptr_t id(const void* handle) {
  return reinterpret_cast<uintptr_t>(handle);
}

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

inline void event_creation(orEvent_t event) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_event_creation(kType, id(event));
  }
}

inline void event_deletion(orEvent_t event) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_event_deletion(kType, id(event));
  }
}

inline void event_record(orEvent_t event, orStream_t stream) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_event_record(kType, id(event), id(stream));
  }
}

inline void event_wait(orEvent_t event, orStream_t stream) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_event_wait(kType, id(event), id(stream));
  }
}

inline void event_synchronization(orEvent_t event) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_event_synchronization(kType, id(event));
  }
}

inline void stream_creation(orStream_t stream) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_stream_creation(kType, id(stream));
  }
}

inline void stream_synchronization(orStream_t stream) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_stream_synchronization(kType, id(stream));
  }
}

inline void device_synchronization() {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_device_synchronization(kType);
  }
}

inline void memory_allocation(const void* ptr) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_memory_allocation(kType, id(ptr));
  }
}

inline void memory_deallocation(const void* ptr) {
  if (const auto* interp = listener()) {
    (*interp)->trace_gpu_memory_deallocation(kType, id(ptr));
  }
}

} // namespace openreg::gpu_trace
