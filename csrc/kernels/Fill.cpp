// fill_.Scalar (and so ones_like, full, ...): torch's own native fill_
// is device-generic; it builds a nullary TensorIterator and calls fill_stub,
// whose openreg kernel is torch's CPU one (`cpu_kernel: true` in the yaml).
// Small dense tensors are filled here directly.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include <ATen/Dispatch_v2.h>
#include <ATen/Parallel.h>
#include <ATen/ops/fill_native.h>

#include "OpenRegNativeFunctions.h"
#include "kernels/CpuIterator.h"
#include "device/OpenRegDevice.h"
#include "device/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::native {

namespace {

// A small dense tensor (its elements fill one block of memory) filled with
// std::fill_n of `value.to<scalar_t>()`, the value CPU's fill kernel writes
// (with the same error for a value the dtype cannot hold). Building the
// iterator CPU's fill_ builds cost more than CPU's whole fill_ on a small
// tensor (docs/performance.md). The fill is launched on the current stream
// with the element converted here, as CUDA converts before its launch. False
// (nothing done) for other tensors; `self` has a plain_dtype.
bool fill_dense(at::Tensor& self, const at::Scalar& value) {
  const int64_t n = self.numel();
  if (n == 0 || n >= at::internal::GRAIN_SIZE || !self.is_non_overlapping_and_dense() || self.is_conj() ||
      self.is_neg()) {
    return false;
  }
  AT_DISPATCH_V2(
      self.scalar_type(), "openreg_fill", AT_WRAP([&] {
        scalar_t element;
        if constexpr (std::is_same_v<scalar_t, at::Half> || std::is_same_v<scalar_t, at::BFloat16>) {
          // CPU fills one element without an iterator (at::detail::scalar_fill),
          // which lets a value out of half's or bfloat16's range become inf.
          element = n == 1 ? static_cast<scalar_t>(value.to<double>()) : value.to<scalar_t>();
        } else {
          element = value.to<scalar_t>();
        }
        launch_kernel(
            self.device().index(), "openreg::fill_dense", n,
            [data = static_cast<scalar_t*>(orKernelAddress(self.mutable_data_ptr())), n, element] {
              std::fill_n(data, n, element);
            });
      }),
      AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kBool, at::kHalf, at::kBFloat16);
  return true;
}

// CPU's fill kernel converts the value with value.to<scalar_t>(), which
// raises for a value the dtype cannot hold. That kernel runs queued on the
// stream (CpuKernelOf), so the conversion is checked here first, raising at
// the call as CUDA's fill_ (which converts on the host before its launch) does.
void check_fill_value(at::ScalarType dtype, const at::Scalar& value) {
  AT_DISPATCH_V2(
      dtype, "openreg_fill_check", AT_WRAP([&] { (void)value.to<scalar_t>(); }),
      AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kBool, at::kHalf, at::kBFloat16, at::kComplexHalf,
      AT_EXPAND(AT_FLOAT8_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES));
}

} // namespace

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  if (plain_dtype(self.scalar_type()) && fill_dense(self, value)) {
    return self;
  }
  if (self.numel() == 1) {
    // CPU fills one element without the iterator (at::detail::scalar_fill),
    // whose conversion raises for fewer values (a float8 or half
    // overflow becomes inf): the element is filled on the CPU and copied.
    return self.copy_(at::empty({}, self.options().device(at::kCPU)).fill_(value));
  }
  check_fill_value(self.scalar_type(), value);
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
    launch_kernel(
        self.device().index(), "openreg::zero_", self.numel(),
        [data = orKernelAddress(self.data_ptr()), nbytes = self.nbytes()] { std::memset(data, 0, nbytes); });
    return self;
  }
  const OptionalDeviceGuard guard(self.device());
  return at::native::fill_(self, 0);
}

} // namespace openreg::native
