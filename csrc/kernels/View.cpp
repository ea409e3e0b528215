// Views and tensor geometry: as_strided, view, _reshape_alias, resize_, set_,
// and which tensors may take each other's geometry (set_data).
// Views only touch metadata, so ATen's device-generic implementations serve;
// resize_ and set_ may grow a storage, which must go through the openreg
// allocator and runtime memcpy rather than resize_bytes_cpu's host memcpy.
#include <ATen/Context.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>

#include "OpenRegNativeFunctions.h"
#include "memory/OpenRegAllocator.h"

namespace openreg::native {
namespace {

// Sets sizes (and strides, when given; else contiguous) and grows the storage
// when it is too small; the openreg counterpart of at::native::resize_impl_cpu_.
void resize_impl(c10::TensorImpl* self, at::IntArrayRef size, at::OptionalIntArrayRef stride) {
  if (self->sizes() == size && (!stride || self->strides() == *stride)) {
    return;
  }
  const auto itemsize = self->dtype().itemsize();
  const auto storage_offset = self->storage_offset();
  size_t needed = 0;
  if (stride) {
    self->set_sizes_and_strides(size, *stride);
    needed = at::detail::computeStorageNbytes(size, *stride, itemsize, storage_offset);
  } else {
    self->set_sizes_contiguous(size);
    needed = at::detail::computeStorageNbytesContiguous(size, itemsize, storage_offset);
  }
  // As for CPU: a tensor with no elements never needs storage.
  if (self->numel() > 0 && needed > self->storage().nbytes()) {
    resize_storage_bytes(self->storage().unsafeGetStorageImpl(), needed);
  }
}

} // namespace

at::Tensor as_strided(
    const at::Tensor& self,
    at::IntArrayRef size,
    at::IntArrayRef stride,
    std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, at::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(
    const at::Tensor& self,
    at::IntArrayRef size,
    std::optional<at::MemoryFormat> memory_format) {
  for (const auto s : size) {
    TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  }
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  const int64_t old_nbytes = impl->unsafe_storage() ? static_cast<int64_t>(impl->unsafe_storage().nbytes()) : 0;
  resize_impl(impl, size, std::nullopt);
  if (memory_format) {
    TORCH_CHECK(
        *memory_format != at::MemoryFormat::Preserve,
        "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  // As CPU's and CUDA's resize_: the memory a deterministic run grows reads as
  // NaN (the largest value for integers), as Factory.cpp's empty.
  if (C10_UNLIKELY(
          at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory())) {
    at::native::fill_resize_deterministic_(self, old_nbytes);
  }
  return self;
}

at::Tensor& set_storage(
    at::Tensor& self,
    at::Storage source,
    int64_t storage_offset,
    at::IntArrayRef size,
    at::IntArrayRef stride) {
  at::native::checkSetStorage(self, std::move(source), storage_offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(storage_offset);
  at::OptionalIntArrayRef stride_opt =
      stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt;
  resize_impl(self.unsafeGetTensorImpl(), size, stride_opt);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const auto itemsize = self.dtype().itemsize();
  TORCH_CHECK(
      source.nbytes() % itemsize == 0, "Storage size (", source.nbytes(),
      " bytes) is not a multiple of the element size (", itemsize, " bytes) of ", self.dtype());
  const int64_t numel = static_cast<int64_t>(source.nbytes() / itemsize);
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) {
    return self;
  }
  TORCH_CHECK(
      self.dtype() == source.dtype(), "set_: expected source of dtype ", self.dtype(),
      " but got ", source.dtype());
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return set_storage(self, std::move(empty), 0, {0}, {});
}

// `param.data = t` (VariableHooks::set_data) and Module._apply, which keeps a
// module's Parameter objects only where this is true, ask it through the
// dispatcher. c10's TensorImpl::has_compatible_shallow_copy_type lets dense
// tensors of CPU, CUDA and the other in-tree backends exchange metadata but
// leaves PrivateUse1 out and points backends at this operator: without it,
// `module.to("openreg")` replaces every Parameter (tied weights come untied,
// lazy modules lose their UninitializedParameter, optimizers keep the old
// objects). Openreg memory is dense memory like theirs, so it joins c10's list.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto is_dense = [](c10::DispatchKeySet keys) {
    constexpr auto dense_backends = c10::DispatchKeySet(
        {c10::BackendComponent::CPUBit,
         c10::BackendComponent::CUDABit,
         c10::BackendComponent::MPSBit,
         c10::BackendComponent::HIPBit,
         c10::BackendComponent::XPUBit,
         c10::BackendComponent::HPUBit,
         c10::BackendComponent::MTIABit,
         c10::BackendComponent::PrivateUse1Bit});
    return keys.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && keys.has_any(dense_backends);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
      (is_dense(self.key_set()) && is_dense(from.key_set()));
}

} // namespace openreg::native
