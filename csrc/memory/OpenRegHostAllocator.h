// Pinned host memory for openreg: what Tensor.pin_memory(), pin_memory=True and
// non-blocking device-to-host copies allocate (through the PrivateUse1 hooks).
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace openreg {

at::HostAllocator* pinned_host_allocator();

} // namespace openreg
