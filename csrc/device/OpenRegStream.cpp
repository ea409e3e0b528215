#include "device/OpenRegStream.h"

#include <array>
#include <atomic>
#include <mutex>

#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"
#include "device/OpenRegGpuTrace.h"
#include "operators/OpenRegLaunch.h"
#include "operators/OpenRegTrace.h"

namespace openreg {
namespace {

constexpr int kStreamsPerPool = 8;
constexpr int kPriorityLevels = 2; // priority 0 and -1, orDeviceGetStreamPriorityRange

// Streams are made on first use. Every kernel call looks its stream up, so the
// made ones are read through atomics first: std::call_once alone would set two
// thread-locals on every call (libstdc++), each a call into the dynamic linker
// from this dlopen'ed library.
struct DeviceStreams {
  std::once_flag once;
  std::atomic<orStream_t> default_stream{nullptr};
  std::array<std::array<std::once_flag, kStreamsPerPool>, kPriorityLevels> pool_once;
  std::array<std::array<std::atomic<orStream_t>, kStreamsPerPool>, kPriorityLevels> pool{};
  std::array<std::atomic<uint32_t>, kPriorityLevels> next{};
};

std::array<DeviceStreams, kMaxDevices>& devices() {
  static auto* d = new std::array<DeviceStreams, kMaxDevices>(); // leaked with the streams
  return *d;
}

// Current stream id per device of this thread; 0 is the default stream.
thread_local std::array<c10::StreamId, kMaxDevices> current_ids{};

int level_of(int priority) {
  return priority < 0 ? 1 : 0;
}

c10::StreamId pool_id(int level, int index) {
  return 1 + level * kStreamsPerPool + index;
}

// The stream in `slot`, made by `make` (which returns it) on first use.
template <typename Make>
orStream_t made_once(std::atomic<orStream_t>& slot, std::once_flag& once, Make&& make) {
  if (orStream_t made = slot.load(std::memory_order_acquire)) {
    return made;
  }
  std::call_once(once, [&] { slot.store(make(), std::memory_order_release); });
  return slot.load(std::memory_order_acquire);
}

orStream_t pool_stream(c10::DeviceIndex device, int level, int index) {
  DeviceStreams& d = devices()[device];
  return made_once(d.pool[level][index], d.pool_once[level][index], [&] {
    const int previous = current_device();
    set_device(device);
    orStream_t stream = nullptr;
    const orError status = orStreamCreateWithPriority(&stream, level == 1 ? -1 : 0);
    set_device(static_cast<c10::DeviceIndex>(previous));
    OPENREG_CHECK(status);
    gpu_trace::stream_creation(stream); // where CUDA's pool streams report it (CUDAStream.cpp)
    return stream;
  });
}

} // namespace

c10::Stream make_stream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

namespace {

// The runtime stream `id` of `device`, both already valid.
orStream_t valid_raw_stream(c10::DeviceIndex device, c10::StreamId id) {
  if (id == 0) {
    DeviceStreams& d = devices()[device];
    return made_once(d.default_stream, d.once, [&] {
      orStream_t stream = nullptr;
      OPENREG_CHECK(orStreamGetDefault(&stream, device));
      gpu_trace::stream_creation(stream);
      return stream;
    });
  }
  const int level = static_cast<int>((id - 1) / kStreamsPerPool);
  return pool_stream(device, level, static_cast<int>((id - 1) % kStreamsPerPool));
}

} // namespace

orStream_t raw_stream(const c10::Stream& stream) {
  TORCH_CHECK(
      stream.device_type() == c10::DeviceType::PrivateUse1, "expected an openreg stream, got a ",
      stream.device_type(), " stream");
  const c10::DeviceIndex device = stream.device_index();
  check_device_index(device);
  const c10::StreamId id = stream.id();
  TORCH_CHECK(
      id >= 0 && id <= kPriorityLevels * kStreamsPerPool, "invalid openreg stream id ", id,
      ": openreg streams come from torch.Stream(device=\"openreg\") or torch.openreg.Stream().");
  return valid_raw_stream(device, id);
}

// c10 passes -1 for "the current device" (torch.Event(device="openreg")).
c10::DeviceIndex resolve(c10::DeviceIndex device) {
  const c10::DeviceIndex index = device == -1 ? current_device() : device;
  check_device_index(index);
  return index;
}

c10::Stream current_stream(c10::DeviceIndex device) {
  device = resolve(device);
  return make_stream(device, current_ids[device]);
}

c10::StreamId current_stream_id(c10::DeviceIndex device) noexcept {
  return current_ids[device];
}

c10::Stream default_stream(c10::DeviceIndex device) {
  device = resolve(device);
  return make_stream(device, 0);
}

c10::Stream exchange_stream(const c10::Stream& stream) {
  (void)raw_stream(stream); // validates
  const c10::DeviceIndex device = stream.device_index();
  const c10::Stream previous = make_stream(device, current_ids[device]);
  current_ids[device] = stream.id();
  return previous;
}

c10::Stream stream_from_pool(c10::DeviceIndex device, int priority) {
  device = resolve(device);
  const int level = level_of(priority);
  const auto index = devices()[device].next[level].fetch_add(1) % kStreamsPerPool;
  return make_stream(device, pool_id(level, static_cast<int>(index)));
}

int stream_priority(const c10::Stream& stream) {
  int priority = 0;
  OPENREG_CHECK(orStreamGetPriority(raw_stream(stream), &priority));
  return priority;
}

namespace {
std::atomic<int> debug_mode{0};
std::atomic<uint64_t> host_waits{0};
} // namespace

uint64_t host_wait_count() {
  return host_waits.load(std::memory_order_relaxed);
}

void set_sync_debug_mode(int mode) {
  TORCH_CHECK_VALUE(mode >= 0 && mode <= 2, "invalid sync debug mode ", mode, ": 0 (default), 1 (warn) or 2 (error)");
  debug_mode.store(mode, std::memory_order_relaxed);
}

int sync_debug_mode() {
  return debug_mode.load(std::memory_order_relaxed);
}

void check_sync_debug(const char* what) {
  host_waits.fetch_add(1, std::memory_order_relaxed);
  const int mode = debug_mode.load(std::memory_order_relaxed);
  if (C10_LIKELY(mode == 0)) {
    return;
  }
  TORCH_CHECK(mode != 2, "called a synchronizing openreg operation (", what, ")");
  TORCH_WARN("called a synchronizing openreg operation (", what, ")");
}

void synchronize_stream(const c10::Stream& stream) {
  check_sync_debug("Stream.synchronize");
  orStream_t raw = raw_stream(stream);
  gpu_trace::stream_synchronization(raw); // before the wait, as c10/cuda/CUDAFunctions.h's stream_synchronize
  OPENREG_CHECK(orStreamSynchronize(raw));
}

orStream_t current_raw_stream(c10::DeviceIndex device) {
  // `device` is a tensor's, so valid, and current ids are validated when set.
  TORCH_INTERNAL_ASSERT(device >= 0 && device < kMaxDevices, "openreg device index ", static_cast<int>(device));
  return valid_raw_stream(device, current_ids[device]);
}

bool current_stream_idle(c10::DeviceIndex device) {
  if (orStreamQueryAll() == orError::Success) {
    return true; // nothing queued anywhere: no stream to look up
  }
  bool idle = false;
  OPENREG_CHECK(orStreamIsIdle(current_raw_stream(device), &idle));
  return idle;
}

bool current_stream_capturing(c10::DeviceIndex device) {
  if (C10_LIKELY(!orStreamCaptureUnderway())) {
    return false;
  }
  bool capturing = false;
  OPENREG_CHECK(orStreamIsCapturing(current_raw_stream(device), &capturing));
  return capturing;
}

void wait_current_stream(c10::DeviceIndex device) {
  if (orStreamQueryAll() == orError::Success || inside_kernel()) {
    return; // nothing queued or failed anywhere, or already in stream order
  }
  OPENREG_CHECK(orStreamSynchronize(current_raw_stream(device)));
}

void join_current_stream(c10::DeviceIndex device) {
  wait_current_stream(device);
  // Every kernel passes here before touching device memory, after any wait:
  // where a profiled call's device work starts.
  if (C10_UNLIKELY(trace::observed(trace::kProfile))) {
    trace::stream_joined(device);
  }
}

} // namespace openreg
