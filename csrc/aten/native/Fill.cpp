// fill_.Scalar (and so ones_like, full, ...): torch's own native fill_
// is device-generic; it builds a nullary TensorIterator and calls fill_stub,
// whose openreg kernel is torch's CPU one (`cpu_kernel: true` in the yaml).
#include <cstring>

#include <ATen/Parallel.h>
#include <ATen/ops/fill_native.h>

#include "OpenRegNativeFunctions.h"
#include "aten/OpenRegDevice.h"
#include "aten/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::native {

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  return at::native::fill_(self, value);
}

// zero_: as CPU's zero_, a memset of a small dense tensor, fill_(0) otherwise.
// An empty tensor may have no memory at all (a null data pointer, which
// memset must not get even for 0 bytes): nothing to do. Its wrapper has no
// device guard (`device_guard: false`): the memset names the tensor's device
// itself, so only fill_ gets one.
at::Tensor& zero_(at::Tensor& self) {
  if (self.numel() == 0) {
    return self;
  }
  if (self.is_non_overlapping_and_dense() && self.numel() < at::internal::GRAIN_SIZE) {
    join_current_stream(self.device().index());
    std::memset(orKernelAddress(self.data_ptr()), 0, self.nbytes());
    return self;
  }
  const OptionalDeviceGuard guard(self.device());
  return at::native::fill_(self, 0);
}

} // namespace openreg::native
