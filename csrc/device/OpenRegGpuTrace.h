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
// While no tool listens, each call is a relaxed load of a flag.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>

#include <c10/core/impl/GPUTrace.h>

#include "runtime/OpenRegRuntime.h"

namespace openreg::gpu_trace {

// Whether a tool listens: set by torch.openreg.sanitizer's enable() and
// disable() (_C._set_gpu_trace). c10 keeps a trace activated for good
// (torch._C._activate_gpu_trace has no inverse), so without this switch every
// allocation would call into Python for the rest of the process.
inline std::atomic<bool>& reporting() {
  static std::atomic<bool> on{false};
  return on;
}

// Whether the calling thread has a Python error set (the Python layer
// installs the check when it loads, csrc/python/Module.cpp): tensors freed while an
// operator's error travels to Python (its arguments released after the error
// was set) must not call the hook, whose Python call would fail with a
// SystemError and clear the error it was raising.
inline bool (*&python_error_pending())() {
  static bool (*check)() = nullptr;
  return check;
}

// The hook to call, or nullptr. Nothing is reported from inside a kernel: a
// kernel runs on a stream's worker thread, and the hook takes the GIL, which
// the thread waiting for that stream may hold. What a kernel allocates and
// frees inside itself (CPU kernels' temporaries) is no tensor of the program.
// Nor while an exception unwinds the stack or a Python error is set (above).
inline const c10::impl::PyInterpreter* listener() {
  if (C10_LIKELY(!reporting().load(std::memory_order_relaxed))) {
    return nullptr;
  }
  const c10::impl::PyInterpreter* interp = c10::impl::GPUTrace::get_trace();
  if (interp == nullptr || orInsideKernel() || std::uncaught_exceptions() > 0 ||
      (python_error_pending() != nullptr && python_error_pending()())) {
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
