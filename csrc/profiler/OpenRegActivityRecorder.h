// What the openreg device did while a profiler listened: kernels and copies,
// with device, stream, device-side times and the correlation id that ties each
// to the framework call that issued it.
//
// Kernels are reported by the instrumentation scope every call the backend
// serves opens (operators/OpenRegTrace.h): the outermost call on a thread that
// touched device memory is one kernel, from when it joined its device's
// stream (join_current_stream) to its end. Copies are reported by the
// runtime's activity records (orActivitySetCallback). Correlation ids come
// from the runtime's per-thread external correlation stack, which the
// profiler session feeds.
//
// Off, recording costs nothing beyond what the trace scope, stream joins and
// the runtime copy paths already pay (one relaxed atomic load each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/OpenRegRuntime.h"

namespace openreg::profiler {

struct Activity {
  enum class Kind : uint8_t { Kernel, Memcpy };

  Kind kind = Kind::Kernel;
  std::string name; // the call ("aten::abs") or the copy ("Memcpy HtoD")
  std::string route; // Kernel: how openreg served the call ("CPU fallback", ...)
  int device = 0;
  uint64_t stream = 0; // orStreamGetId
  uint64_t correlation_id = 0; // 0: issued outside any profiled call
  int64_t start_ns = 0; // orActivityGetTimestamp: nanoseconds since the Unix epoch
  int64_t end_ns = 0;
  size_t bytes = 0; // Memcpy
  orMemcpyKind copy_kind = orMemcpyKind::HostToDevice; // Memcpy
};

// Starts recording the kinds asked for; throws if already recording (one
// profiler session at a time, as Kineto runs them).
void start_recording(bool kernels, bool copies);
// Stops recording and hands over what was recorded. Copies still in flight
// on a stream are not waited for: synchronize first (torch's profilers call
// torch.openreg.synchronize() on exit) to see them.
std::vector<Activity> stop_recording();

// For tests of the off path: whether any observer is installed, and how many
// activities are buffered.
bool is_recording();
size_t buffered_activities();

// "Memcpy HtoD", ..., as CUDA's profiler names copies.
const char* memcpy_name(orMemcpyKind kind);

} // namespace openreg::profiler
