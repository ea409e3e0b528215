#include "OpenRegHostAlias.h"

#include <ATen/core/TensorBase.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

namespace openreg {
namespace {
void release_device_storage(void* ctx) {
  delete static_cast<c10::Storage*>(ctx);
}
} // namespace

c10::Storage host_alias_storage(const c10::Storage& device_storage) {
  auto* keep_alive = new c10::Storage(device_storage);
  void* data = device_storage.unsafeGetStorageImpl()->data_ptr().get();
  c10::DataPtr ptr(data, keep_alive, &release_device_storage, c10::Device(c10::DeviceType::CPU));
  return c10::Storage(
      c10::Storage::use_byte_size_t(), device_storage.nbytes(), std::move(ptr),
      c10::GetCPUAllocator(), /*resizable=*/true);
}

at::Tensor host_alias(const at::Tensor& t, const c10::Storage& host_storage) {
  auto alias = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(host_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
  return alias;
}

} // namespace openreg
