// Pinned host memory for openreg: what Tensor.pin_memory(), pin_memory=True and
// non-blocking device-to-host copies allocate (through the PrivateUse1 hooks).
#pragma once

#include <c10/core/Allocator.h>

namespace openreg {

c10::Allocator* pinned_host_allocator();

} // namespace openreg
