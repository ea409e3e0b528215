// Device bookkeeping shared by the guard, the hooks and the Python bindings:
// the one place that validates device indices and the runtime configuration.
#pragma once

#include <optional>

#include <c10/core/Device.h>

namespace openreg {

// Throws a c10::Error explaining a malformed OPENREG_DEVICE_COUNT; otherwise no-op.
void ensure_initialized();
bool is_initialized();
// True in a child process forked after openreg was initialised in its parent.
bool in_forked_child();
c10::DeviceIndex device_count() noexcept;
c10::DeviceIndex current_device();
// The current device without initialising openreg (what generators and the
// RNG setters need, as torch.cuda's defer initialisation).
c10::DeviceIndex peek_current_device() noexcept;
void set_device(c10::DeviceIndex index);
// Throws a c10::Error (RuntimeError) naming the valid range when out of range.
void check_device_index(c10::DeviceIndex index);
// The same check without initialising openreg (generators, as CUDA's, do not).
void validate_device_index(c10::DeviceIndex index);
void synchronize(c10::DeviceIndex index);

// What c10::OptionalDeviceGuard does in the generated wrappers, at no cost
// when the device is already current (the usual case): c10's guard makes two
// virtual calls into the guard implementation on entry and one on exit
// whatever the device. Non-openreg devices (a CPU operand first) change
// nothing, as c10's CPU guard.
class OptionalDeviceGuard {
 public:
  OptionalDeviceGuard() = default;
  explicit OptionalDeviceGuard(std::optional<c10::Device> device) {
    reset_device(device);
  }
  OptionalDeviceGuard(const OptionalDeviceGuard&) = delete;
  OptionalDeviceGuard& operator=(const OptionalDeviceGuard&) = delete;
  ~OptionalDeviceGuard();

  // Makes `device` current until the guard ends (or the next reset).
  void reset_device(std::optional<c10::Device> device);
  // The device last given to reset_device, if any.
  std::optional<c10::Device> current_device() const {
    return device_;
  }

 private:
  std::optional<c10::Device> device_;
  c10::DeviceIndex original_ = -1; // the device to restore, once one was set
};

} // namespace openreg
