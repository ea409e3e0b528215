#include "OpenRegActivityRecorder.h"

#include <mutex>

#include <c10/util/Exception.h>

#include "device/OpenRegStream.h"
#include "operators/OpenRegTrace.h"

namespace openreg::profiler {
namespace {

struct Recorder {
  std::mutex mutex;
  bool on = false; // guarded by mutex; hooks that fire after stop drop their activity
  std::vector<Activity> activities;
};

Recorder& recorder() {
  static auto* r = new Recorder(); // leaked: stream workers may report during static dtors
  return *r;
}

uint64_t stream_id(orStream_t stream) {
  uint64_t id = 0;
  orStreamGetId(stream, &id);
  return id;
}

void keep(Activity&& activity) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.on) {
    r.activities.push_back(std::move(activity));
  }
}

// trace::ProfilerHook. A kernel run in the calling thread (a small one on an
// idle stream, a route that runs CPU code in place) is the device work of
// the outermost call on the thread: from the moment it joined its device's
// stream (the trace marks that, trace::stream_joined) to the end of the call.
// Nested calls are part of it; a call that only queued kernels, or never
// touched device memory, is no kernel here (queued kernels: on_queued_kernel).
void on_call(trace::Call& call, bool begin) noexcept {
  if (begin || call.device_start_ns == 0) {
    return;
  }
  try {
    Activity a;
    a.kind = Activity::Kind::Kernel;
    a.end_ns = orActivityGetTimestamp();
    a.start_ns = call.device_start_ns;
    a.name = trace::call_name(call);
    a.route = route_name(call.route);
    a.device = call.device;
    // Kernels run in the launching thread once its current stream of the
    // device is idle (join_current_stream): they belong to that stream.
    a.stream = stream_id(raw_stream(current_stream(static_cast<c10::DeviceIndex>(a.device))));
    a.correlation_id = orActivityGetExternalCorrelationId();
    keep(std::move(a));
  } catch (...) {
    // A hook must not throw out of a scope's destructor; a kernel whose
    // stream cannot be resolved is not recorded.
  }
}

// trace::QueuedKernelHook: a kernel a profiled call queued, as it ran on its
// stream (in the stream's thread).
void on_queued_kernel(const trace::QueuedKernel& kernel) noexcept {
  try {
    Activity a;
    a.kind = Activity::Kind::Kernel;
    a.start_ns = kernel.start_ns;
    a.end_ns = kernel.end_ns;
    const bool named = kernel.call.op != nullptr || kernel.call.op_name != nullptr;
    a.name = named ? trace::call_name(kernel.call) : "openreg kernel";
    a.route = route_name(kernel.call.route);
    a.device = kernel.device;
    a.stream = kernel.stream;
    a.correlation_id = kernel.correlation_id;
    keep(std::move(a));
  } catch (...) {
    // Not recorded (out of memory): the kernel itself ran.
  }
}

// orActivityCallback; runs on the thread that moved the bytes.
void on_copy(const orActivityMemcpy& record) {
  Activity a;
  a.kind = Activity::Kind::Memcpy;
  a.name = memcpy_name(record.kind);
  a.device = record.device;
  a.stream = stream_id(record.stream);
  a.correlation_id = record.correlation_id;
  a.start_ns = record.start_ns;
  a.end_ns = record.end_ns;
  a.bytes = record.bytes;
  a.copy_kind = record.kind;
  keep(std::move(a));
}

} // namespace

const char* memcpy_name(orMemcpyKind kind) {
  switch (kind) {
    case orMemcpyKind::HostToHost:
      return "Memcpy HtoH";
    case orMemcpyKind::HostToDevice:
      return "Memcpy HtoD";
    case orMemcpyKind::DeviceToHost:
      return "Memcpy DtoH";
    case orMemcpyKind::DeviceToDevice:
      return "Memcpy DtoD";
  }
  return "Memcpy";
}

void start_recording(bool kernels, bool copies) {
  Recorder& r = recorder();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    TORCH_CHECK(!r.on, "openreg is already recording device activity for another profiler session; "
                "stop that profiler first (one session at a time).");
    r.on = true;
    r.activities.clear();
  }
  if (kernels) {
    trace::set_profiler_hook(&on_call);
    trace::set_queued_kernel_hook(&on_queued_kernel);
    trace::set_observer(trace::kProfile, true);
  }
  if (copies) {
    orActivitySetCallback(&on_copy);
  }
}

std::vector<Activity> stop_recording() {
  Recorder& r = recorder();
  // Observers off first, so the off path is restored before the lock is taken.
  trace::set_observer(trace::kProfile, false);
  orActivitySetCallback(nullptr);
  std::vector<Activity> recorded;
  std::lock_guard<std::mutex> lock(r.mutex);
  r.on = false;
  recorded.swap(r.activities);
  return recorded;
}

bool is_recording() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.on || trace::observed(trace::kProfile);
}

size_t buffered_activities() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.activities.size();
}

} // namespace openreg::profiler
