// Copies between host and device and between devices, and .item().
//
// copy_(..., non_blocking=True) queues the copy on the current stream when it
// can (see can_copy_async); every other copy is synchronous.
#include <optional>

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/copy_native.h>
#include <c10/core/DeviceGuard.h>

#include "OpenRegNativeFunctions.h"
#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"
#include "operators/cpu/OpenRegCpuAlias.h"
#include "device/OpenRegGpuTrace.h"
#include "memory/OpenRegHostAllocator.h"
#include "operators/OpenRegLaunch.h"
#include "device/OpenRegStream.h"
#include "operators/OpenRegTensorFormat.h"

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
  // The runtime tags a copy with the issuing thread's correlation id (the
  // profiled operator's); intra-op threads carry the caller's.
  const uint64_t correlation_id = orActivityGetExternalCorrelationId();
  at::parallel_for(0, static_cast<int64_t>(nbytes), kGrainBytes, [&](int64_t begin, int64_t end) {
    const bool forward = correlation_id != orActivityGetExternalCorrelationId();
    if (forward) {
      orActivityPushExternalCorrelationId(correlation_id);
    }
    const orError status = orMemcpy(
        static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
        static_cast<size_t>(end - begin), kind);
    if (forward) {
      orActivityPopExternalCorrelationId();
    }
    OPENREG_CHECK(status);
  });
}

// The device whose stream orders a copy: the destination's for copies into
// openreg, else the source's.
c10::DeviceIndex stream_device(const at::Tensor& src, const at::Tensor& dst) {
  return dst.device().is_privateuseone() ? dst.device().index() : src.device().index();
}

// A non-blocking copy is asynchronous, as with CUDA, only when its host side
// is pinned (a pageable host buffer could be freed or reused as soon as the
// call returns) or when both sides are on the device.
bool can_copy_async(const at::Tensor& src, const at::Tensor& dst) {
  for (const at::Tensor* t : {&src, &dst}) {
    if (t->is_cpu() && !t->is_pinned()) {
      return false;
    }
  }
  return true;
}

// The host waited for the current stream of `device`. CUDA reports its
// host waits through at::cuda::stream_synchronize (c10/cuda/CUDAFunctions.h):
// a synchronous copy with a host side (ATen/native/cuda/Copy.cu) and .item()
// (memcpy_and_sync) do. openreg's synchronous copies between two devices wait
// for both, where CUDA orders the two streams with events: both make the
// copy ordered after the work of both streams and before what follows.
void report_host_wait(c10::DeviceIndex device) {
  if (c10::impl::GPUTrace::get_trace() != nullptr) {
    gpu_trace::stream_synchronization(current_raw_stream(device));
  }
}

// For a synchronous copy: a copy within one device is an ordinary kernel on
// its stream for the sanitizer, as on CUDA, though it runs here in the host.
void report_sync_copy(const at::Tensor& src, const at::Tensor& dst) {
  if (src.device() == dst.device()) {
    return;
  }
  for (const at::Tensor* t : {&src, &dst}) {
    if (t->device().is_privateuseone()) {
      report_host_wait(t->device().index());
    }
  }
}

void copy_async(const at::Tensor& src, const at::Tensor& dst) {
  if (src.device() == dst.device()) {
    // Within one device the copy is a kernel (launch_kernel): a small one on
    // an idle stream is done at once (baddbmm's meta() copies its input into
    // the output, and its kernel waits for that copy), a large one on the
    // worker with the launching thread's intra-op threads, at CPU's copy_
    // bandwidth (the runtime's orMemcpyAsync copies in one thread). The copy
    // carries the launching operator's correlation id for the profiler.
    launch_kernel(
        dst.device().index(), "openreg::copy_", dst.numel(),
        [to = dst.mutable_data_ptr(), from = src.const_data_ptr(), nbytes = dst.nbytes(),
         correlation_id = orActivityGetExternalCorrelationId()] {
          OPENREG_CHECK(orActivityPushExternalCorrelationId(correlation_id));
          struct Pop {
            ~Pop() {
              orActivityPopExternalCorrelationId();
            }
          } pop;
          parallel_memcpy(to, from, nbytes, orMemcpyKind::DeviceToDevice);
        });
    return;
  }
  const c10::Stream stream = current_stream(stream_device(src, dst));
  if (src.device().is_privateuseone() && dst.device().is_privateuseone() && src.device() != dst.device()) {
    // The source's device must have produced it first.
    join_current_stream(src.device().index());
    report_host_wait(src.device().index());
  }
  OPENREG_CHECK(orMemcpyAsync(
      dst.mutable_data_ptr(), src.const_data_ptr(), dst.nbytes(), memcpy_kind(src, dst), raw_stream(stream)));
  // The pinned block must not be reused before the copy has run
  // (CachingHostAllocatorImpl::record_event); nor must the device block be
  // handed to another stream (record_stream), as CUDA's copy_ does.
  for (const at::Tensor* t : {&src, &dst}) {
    if (t->is_cpu()) {
      pinned_host_allocator()->record_event(
          t->storage().mutable_data(), t->storage().data_ptr().get_context(), stream);
    }
  }
}

} // namespace

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // Tensor::copy_ routes here (aten/src/ATen/native/Copy.cpp: copy_impl) whenever
  // either side is not a CPU/CUDA tensor; `self` is the source.
  for (const at::Tensor* t : {&self, &dst}) {
    TORCH_CHECK(
        t->is_cpu() || t->device().is_privateuseone(), "openreg cannot copy to or from a ",
        t->device().type(), " tensor: move it to CPU first.");
  }
  // copy_ hands a copy with an openreg side to _copy_from before the checks
  // its TensorIterator makes on CPU (aten/src/ATen/native/Copy.cpp: copy_impl):
  // a view of the very same data is left alone; a destination with elements
  // sharing memory, or partly overlapping the source, is refused as on CPU
  // (a copy_ of t[:-1] into t[1:] would otherwise succeed on openreg only).
  if (dst.is_alias_of(self) && dst.storage_offset() == self.storage_offset() && dst.sizes() == self.sizes() &&
      dst.strides() == self.strides() && dst.scalar_type() == self.scalar_type() &&
      dst.is_conj() == self.is_conj() && dst.is_neg() == self.is_neg()) {
    return dst;
  }
  at::assert_no_internal_overlap(dst);
  at::assert_no_partial_overlap(dst, self);
  // The shape check of CPU's copy_ (its TensorIterator's), made here rather
  // than in the kernel, which may run after this call returned: an argument
  // error raises at the call, as on CUDA (docs/integration/streams.md, "When errors raise").
  if (!dst.sizes().equals(self.sizes())) {
    const at::DimVector shape = at::infer_size_dimvector(dst.sizes(), self.sizes());
    TORCH_CHECK(
        dst.sizes().equals(shape), "output with shape ", dst.sizes(), " doesn't match the broadcast shape ", shape);
  }
  copy_tensor_format(self, dst);
  if (dst.numel() == 0) {
    return dst;
  }
  const at::Tensor& device_side = dst.device().is_privateuseone() ? dst : self;
  c10::DeviceGuard guard(device_side.device());
  // Between two tensors of one device a copy is queued on its stream whatever
  // non_blocking says, as CUDA's is: no host memory is involved.
  const bool on_one_device = self.device() == dst.device();
  // Inside a kernel (a CPU kernel writing back an output of another dtype,
  // say) the copy is part of that kernel and happens now, below.
  if (same_layout_dense(self, dst) && (on_one_device || (non_blocking && can_copy_async(self, dst))) &&
      !inside_kernel()) {
    copy_async(self, dst);
    return dst;
  }
  if (on_one_device) {
    // Dtype conversion, broadcasting, strides, conj/neg: ATen's CPU copy_ kernel,
    // launched on views of the device memory.
    launch_kernel(
        dst.device().index(), "openreg::copy_", dst.numel(),
        [to = kernel_cpu_view(dst), from = kernel_cpu_view(self)]() mutable { at::native::copy_(to, from); });
    return dst;
  }
  // A synchronous copy runs after the work queued on the streams of both sides.
  // A plain memcpy is no kernel: the profiler sees it as the runtime's copy.
  const bool memcpy = same_layout_dense(self, dst);
  if (!non_blocking && (self.is_cpu() || dst.is_cpu())) { // as CUDA's, whose non_blocking copies never wait
    check_sync_debug(dst.is_cpu() ? "copy from openreg to the host" : "copy from the host to openreg");
  }
  for (const at::Tensor* t : {&self, &dst}) {
    if (t->device().is_privateuseone()) {
      memcpy ? wait_current_stream(t->device().index()) : join_current_stream(t->device().index());
    }
  }
  if (memcpy) {
    parallel_memcpy(dst.mutable_data_ptr(), self.const_data_ptr(), dst.nbytes(), memcpy_kind(self, dst));
    report_sync_copy(self, dst);
    return dst;
  }
  // Dtype conversion, broadcasting, strides, conj/neg: ATen's CPU copy kernel
  // run on the device memory, over recycled aliases (copy_ keeps no reference
  // to its operands). CPU's copy_ is called as a function, not dispatched:
  // the caller's copy_ is the one call the profiler and the trace show, as on
  // CUDA, whose copy_ runs its kernel inside.
  std::optional<ScopedCpuAlias> dst_alias;
  std::optional<ScopedCpuAlias> src_alias;
  const at::Tensor& to = dst.device().is_privateuseone() ? dst_alias.emplace(dst).get() : dst;
  const at::Tensor& from = self.device().is_privateuseone() ? src_alias.emplace(self).get() : self;
  at::native::copy_(const_cast<at::Tensor&>(to), from);
  report_sync_copy(self, dst);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, /*non_blocking=*/false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  check_sync_debug("item");
  join_current_stream(self.device().index());
  report_host_wait(self.device().index());
  if (discrete_memory()) {
    at::Tensor host = at::empty({}, at::TensorOptions().dtype(self.scalar_type()));
    OPENREG_CHECK(orMemcpy(host.mutable_data_ptr(), self.const_data_ptr(), self.element_size(), orMemcpyKind::DeviceToHost));
    host._set_conj(self.is_conj());
    host._set_neg(self.is_neg());
    return at::_local_scalar_dense(host);
  }
  return at::_local_scalar_dense(cpu_alias(self));
}

} // namespace openreg::native
