// Activity records of copies and the per-thread external correlation stack.
#include <atomic>
#include <chrono>
#include <vector>

#include "OpenRegRuntimeInternal.h"

namespace openreg {
namespace {

std::atomic<orActivityCallback> callback{nullptr};

// Per thread, as CUPTI keeps its external correlation stack.
thread_local std::vector<uint64_t> correlation_stack;

} // namespace

namespace detail {

orActivityCallback activity_callback() {
  return callback.load(std::memory_order_relaxed);
}

orActivityMemcpy memcpy_record(const void* dst, const void* src, size_t count, orMemcpyKind kind, orStream_t stream) {
  int device = device_of_address(dst);
  if (device < 0) {
    device = device_of_address(src);
  }
  if (device < 0) {
    orGetDevice(&device); // HostToHost: the device that was asked to copy
  }
  if (stream == nullptr) {
    // A synchronous copy is ordered with all work on the device, as cudaMemcpy
    // is with the legacy default stream; it is shown there.
    orStreamGetDefault(&stream, device);
  }
  orActivityMemcpy record{};
  record.kind = kind;
  record.bytes = count;
  record.device = device;
  record.stream = stream;
  record.correlation_id = orActivityGetExternalCorrelationId();
  return record;
}

} // namespace detail

orError orActivitySetCallback(orActivityCallback cb) {
  callback.store(cb);
  return orError::Success;
}

orError orActivityPushExternalCorrelationId(uint64_t id) {
  correlation_stack.push_back(id);
  return orError::Success;
}

orError orActivityPopExternalCorrelationId(uint64_t* id) {
  if (correlation_stack.empty()) {
    return orError::InvalidValue;
  }
  if (id != nullptr) {
    *id = correlation_stack.back();
  }
  correlation_stack.pop_back();
  return orError::Success;
}

int64_t orActivityGetTimestamp() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t orActivityGetExternalCorrelationId() {
  return correlation_stack.empty() ? 0 : correlation_stack.back();
}

} // namespace openreg
