// Device bookkeeping shared by the guard, the hooks and the Python bindings:
// the one place that validates device indices and the runtime configuration.
#pragma once

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
// Throws IndexError-like c10::Error naming the valid range when out of range.
void check_device_index(c10::DeviceIndex index);
// The same check without initialising openreg (generators, as CUDA's, do not).
void validate_device_index(c10::DeviceIndex index);
void synchronize(c10::DeviceIndex index);

} // namespace openreg
