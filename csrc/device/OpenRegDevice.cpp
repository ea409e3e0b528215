#include "device/OpenRegDevice.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

#include "memory/OpenRegAllocatorConfig.h"
#include "device/OpenRegException.h"
#include "device/OpenRegGpuTrace.h"

namespace openreg {
namespace {
std::atomic<bool> initialized{false};
// Set in a child forked after initialisation: the child has none of the
// parent's stream worker threads, and its copy of the runtime's locks may be
// held, so it must not use openreg (CUDA refuses the same way).
std::atomic<bool> in_bad_fork{false};

void mark_child_bad() {
  in_bad_fork.store(true, std::memory_order_relaxed);
}
} // namespace

void ensure_initialized() {
  if (initialized.load(std::memory_order_acquire)) {
    TORCH_CHECK(
        !in_bad_fork.load(std::memory_order_relaxed),
        "Cannot re-initialize OpenReg in forked subprocess. To use OpenReg with multiprocessing, "
        "you must use the 'spawn' start method (torch.multiprocessing.set_start_method('spawn')).");
    return;
  }
  static std::once_flag once;
  const char* message = nullptr;
  orError status = orInit(&message);
  TORCH_CHECK(status == orError::Success, message);
  load_allocator_config(); // raises on a malformed PYTORCH_OPENREG_ALLOC_CONF, as orInit on its variables
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &mark_child_bad); });
  initialized.store(true, std::memory_order_release);
}

bool in_forked_child() {
  return in_bad_fork.load(std::memory_order_relaxed);
}

bool is_initialized() {
  return initialized.load(std::memory_order_acquire);
}

c10::DeviceIndex device_count() noexcept {
  int count = 0;
  // A malformed configuration reports zero devices here; ensure_initialized()
  // is where it becomes an error with an explanation.
  (void)orGetDeviceCount(&count);
  return static_cast<c10::DeviceIndex>(count);
}

c10::DeviceIndex current_device() {
  ensure_initialized();
  return peek_current_device();
}

c10::DeviceIndex peek_current_device() noexcept {
  int device = 0;
  (void)orGetDevice(&device);
  return static_cast<c10::DeviceIndex>(device);
}

void check_device_index(c10::DeviceIndex index) {
  ensure_initialized();
  validate_device_index(index);
}

void validate_device_index(c10::DeviceIndex index) {
  const auto count = device_count();
  // A RuntimeError, as CUDA's "invalid device ordinal".
  TORCH_CHECK(
      index >= 0 && index < count,
      "The device index is out of range: openreg:", static_cast<int>(index), ", and this process has ",
      static_cast<int>(count), " openreg device", count == 1 ? "" : "s", " (openreg:0 to openreg:",
      static_cast<int>(count) - 1, "). Use a smaller index, or set OPENREG_DEVICE_COUNT before "
      "starting Python to simulate more devices.");
}

void set_device(c10::DeviceIndex index) {
  check_device_index(index);
  OPENREG_CHECK(orSetDevice(index));
}

void synchronize(c10::DeviceIndex index) {
  check_device_index(index);
  // torch.openreg.synchronize() comes here directly, not through the guard's
  // synchronizeDevice, so the trace is reported here for both.
  gpu_trace::device_synchronization();
  OPENREG_CHECK(orDeviceSynchronize(index));
}

OptionalDeviceGuard::~OptionalDeviceGuard() {
  if (original_ >= 0) {
    (void)orSetDevice(original_); // valid when it was current; destructors must not throw
  }
}

void OptionalDeviceGuard::reset_device(std::optional<c10::Device> device) {
  if (!device.has_value()) {
    return;
  }
  device_ = device;
  if (!device->is_privateuseone()) {
    return;
  }
  const c10::DeviceIndex current = peek_current_device();
  if (!device->has_index() || device->index() == current) {
    return;
  }
  set_device(device->index()); // validates the index before anything changes
  if (original_ < 0) {
    original_ = current;
  }
}

} // namespace openreg
