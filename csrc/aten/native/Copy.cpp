// Copies between host and device and between devices, and .item().
#include <ATen/Parallel.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/copy.h>
#include <c10/core/DeviceGuard.h>

#include "OpenRegNativeFunctions.h"
#include "aten/OpenRegDevice.h"
#include "aten/OpenRegException.h"
#include "aten/OpenRegHostAlias.h"

namespace openreg::native {
namespace {

bool same_layout_dense(const at::Tensor& src, const at::Tensor& dst) {
  return src.dtype() == dst.dtype() && src.sizes() == dst.sizes() && src.strides() == dst.strides() &&
      src.is_conj() == dst.is_conj() && src.is_neg() == dst.is_neg() && src.is_non_overlapping_and_dense();
}

orMemcpyKind memcpy_kind(const at::Tensor& src, const at::Tensor& dst) {
  const bool from_device = src.device().is_privateuseone();
  const bool to_device = dst.device().is_privateuseone();
  if (from_device && to_device) {
    return orMemcpyKind::DeviceToDevice;
  }
  return from_device ? orMemcpyKind::DeviceToHost : orMemcpyKind::HostToDevice;
}

// One orMemcpy per thread's share of the bytes: CPU's copy_ runs on every
// intra-op thread, and a single memcpy does not reach the memory bandwidth.
void parallel_memcpy(void* dst, const void* src, size_t nbytes, orMemcpyKind kind) {
  constexpr int64_t kGrainBytes = 256 * 1024;
  at::parallel_for(0, static_cast<int64_t>(nbytes), kGrainBytes, [&](int64_t begin, int64_t end) {
    OPENREG_CHECK(orMemcpy(
        static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
        static_cast<size_t>(end - begin), kind));
  });
}

at::Tensor host_view(const at::Tensor& t) {
  return t.device().is_privateuseone() ? host_alias(t) : t;
}

} // namespace

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  // Tensor::copy_ routes here (aten/src/ATen/native/Copy.cpp: copy_impl) whenever
  // either side is not a CPU/CUDA tensor; `self` is the source.
  for (const at::Tensor* t : {&self, &dst}) {
    TORCH_CHECK(
        t->is_cpu() || t->device().is_privateuseone(), "openreg cannot copy to or from a ",
        t->device().type(), " tensor: move it to CPU first.");
  }
  if (dst.numel() == 0) {
    return dst;
  }
  const at::Tensor& device_side = dst.device().is_privateuseone() ? dst : self;
  c10::DeviceGuard guard(device_side.device());
  if (same_layout_dense(self, dst)) {
    parallel_memcpy(dst.mutable_data_ptr(), self.const_data_ptr(), dst.nbytes(), memcpy_kind(self, dst));
    return dst;
  }
  // Dtype conversion, broadcasting, strides, conj/neg: ATen's CPU copy kernel
  // run on the device memory.
  host_view(dst).copy_(host_view(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, /*non_blocking=*/false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  synchronize(self.device().index());
  return at::_local_scalar_dense(host_alias(self));
}

} // namespace openreg::native
