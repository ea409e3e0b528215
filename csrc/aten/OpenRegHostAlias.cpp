#include "OpenRegHostAlias.h"

#include <array>
#include <cstring>

#include <ATen/core/TensorBase.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>

#include "aten/OpenRegAllocator.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {
namespace {

void release_device_storage(void* ctx) {
  delete static_cast<c10::Storage*>(ctx);
}

void release_grown(void* ctx) {
  delete static_cast<c10::DataPtr*>(ctx);
}

// The allocator of an alias storage. A CPU kernel that resizes an out= alias
// (at::native::resize_output -> resize_bytes_cpu) allocates through it; the
// new bytes are device memory of the alias's device, wrapped as a CPU DataPtr,
// so the fallback can hand them to the device storage instead of copying
// (take_grown_device_memory).
class GrowthAllocator final : public c10::Allocator {
 public:
  void set_device(c10::DeviceIndex index) {
    index_ = index;
  }

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index_));
    auto* device = new c10::DataPtr(device_allocator()->allocate(nbytes));
    return c10::DataPtr(orKernelAddress(device->get()), device, &release_grown, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  c10::DeviceIndex index_ = 0;
};

GrowthAllocator* growth_allocator(c10::DeviceIndex index) {
  static std::array<GrowthAllocator, kMaxDevices> allocators = [] {
    std::array<GrowthAllocator, kMaxDevices> a;
    for (int i = 0; i < kMaxDevices; ++i) {
      a[i].set_device(static_cast<c10::DeviceIndex>(i));
    }
    return a;
  }();
  return &allocators.at(static_cast<size_t>(index));
}

} // namespace

c10::Storage host_alias_storage(const c10::Storage& device_storage) {
  auto* keep_alive = new c10::Storage(device_storage);
  void* data = orKernelAddress(device_storage.unsafeGetStorageImpl()->data_ptr().get());
  c10::DataPtr ptr(data, keep_alive, &release_device_storage, c10::Device(c10::DeviceType::CPU));
  const c10::DeviceIndex index = device_storage.device().has_index() ? device_storage.device().index() : 0;
  return c10::Storage(
      c10::Storage::use_byte_size_t(), device_storage.nbytes(), std::move(ptr),
      growth_allocator(index), /*resizable=*/true);
}

std::optional<c10::DataPtr> take_grown_device_memory(const c10::Storage& host_storage) {
  const c10::DataPtr& ptr = host_storage.unsafeGetStorageImpl()->data_ptr();
  if (ptr.get_deleter() != &release_grown) {
    return std::nullopt;
  }
  // The alias keeps pointing at the bytes; the device storage owns them now.
  return std::move(*static_cast<c10::DataPtr*>(ptr.get_context()));
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
