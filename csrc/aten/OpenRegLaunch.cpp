#include "aten/OpenRegLaunch.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "aten/OpenRegCpuAlias.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {

namespace {

// t's storage's byte count at `data`, owning nothing: a DataPtr without a
// deleter or context, so nothing is freed with the storage.
c10::Storage unowned_storage(const at::TensorBase& t, void* data, c10::Device device) {
  return c10::Storage(
      c10::Storage::use_byte_size_t(), t.storage().nbytes(), c10::DataPtr(data, device),
      /*allocator=*/nullptr, /*resizable=*/false);
}

} // namespace

at::Tensor kernel_view(const at::TensorBase& t) {
  if (!t.defined()) {
    return {};
  }
  const c10::StorageImpl& memory = *t.storage().unsafeGetStorageImpl();
  c10::Storage storage = unowned_storage(t, const_cast<void*>(memory.data()), memory.device());
  if (memory.device().is_cpu()) {
    return cpu_alias(t, storage); // an operand's CPU alias, at kernel addresses
  }
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  view._set_conj(t.is_conj());
  view._set_neg(t.is_neg());
  return view;
}

at::Tensor kernel_cpu_view(const at::TensorBase& t) {
  TORCH_INTERNAL_ASSERT(t.device().is_privateuseone());
  void* bytes = orKernelAddress(const_cast<void*>(t.storage().unsafeGetStorageImpl()->data()));
  return cpu_alias(t, unowned_storage(t, bytes, c10::Device(c10::kCPU)));
}

at::Tensor kernel_tensor_argument(const at::TensorBase& t) {
  if (!t.defined() || t.device().is_privateuseone()) {
    return kernel_view(t);
  }
  return at::Tensor(t).clone();
}

} // namespace openreg
