#include "OpenRegHostAlias.h"

#include <array>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <ATen/core/TensorBase.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>

#include "aten/OpenRegAllocator.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {
namespace {

// An alias holds a reference to the device StorageImpl itself (no separate
// keep-alive object to allocate per alias).
void release_device_storage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// Device memory handed out as host-visible CPU DataPtrs (allocate_host_visible),
// by kernel address. The CPU DataPtrs have their data as context, as
// Allocator::raw_allocate requires (mkldnn and others allocate raw memory
// through the CPU allocator while a HostCall redirects it).
struct HostVisible {
  std::mutex mutex;
  std::unordered_map<void*, c10::DataPtr> memory;
};

HostVisible& host_visible() {
  static auto* registry = new HostVisible(); // leaked: deleters may run at exit
  return *registry;
}

std::optional<c10::DataPtr> take_host_visible(void* data) {
  HostVisible& r = host_visible();
  const std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.memory.find(data);
  if (it == r.memory.end()) {
    return std::nullopt;
  }
  c10::DataPtr device = std::move(it->second);
  r.memory.erase(it);
  return device;
}

void keep_taken(void* /*data*/) {}

void delete_host_visible(void* data);

// The allocator of an alias storage. A CPU kernel that resizes an out= alias
// (at::native::resize_output -> resize_bytes_cpu) allocates through it; the
// new bytes are device memory of the alias's device, wrapped as a CPU DataPtr,
// so the fallback can hand them to the device storage instead of copying
// (take_grown_device_memory). allocate_host_visible does the allocation.
class GrowthAllocator final : public c10::Allocator {
 public:
  void set_device(c10::DeviceIndex index) {
    index_ = index;
  }

  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_host_visible(index_, nbytes);
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

namespace {
void delete_host_visible(void* data) {
  release_host_visible(data);
}
} // namespace

bool release_host_visible(void* data) {
  // The device memory is freed when the taken DataPtr goes, outside the lock.
  return take_host_visible(data).has_value();
}

c10::DataPtr allocate_host_visible(c10::DeviceIndex index, size_t nbytes) {
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index));
  c10::DataPtr device = device_allocator()->allocate(nbytes);
  if (device.get() == nullptr) {
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
  }
  void* data = orKernelAddress(device.get());
  {
    HostVisible& r = host_visible();
    const std::lock_guard<std::mutex> lock(r.mutex);
    r.memory.emplace(data, std::move(device));
  }
  return c10::DataPtr(data, data, &delete_host_visible, c10::Device(c10::DeviceType::CPU));
}

c10::Storage host_alias_storage(const c10::Storage& device_storage) {
  c10::StorageImpl* keep_alive = device_storage.unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(keep_alive);
  void* data = orKernelAddress(device_storage.unsafeGetStorageImpl()->data_ptr().get());
  c10::DataPtr ptr(data, keep_alive, &release_device_storage, c10::Device(c10::DeviceType::CPU));
  const c10::DeviceIndex index = device_storage.device().has_index() ? device_storage.device().index() : 0;
  return c10::Storage(
      c10::Storage::use_byte_size_t(), device_storage.nbytes(), std::move(ptr),
      growth_allocator(index), /*resizable=*/true);
}

std::optional<c10::DataPtr> take_grown_device_memory(const c10::Storage& host_storage) {
  c10::DataPtr& ptr = host_storage.unsafeGetStorageImpl()->_mutable_data_ptr_no_checks();
  // The host storage keeps pointing at the bytes; the device storage owns them now.
  if (!ptr.compare_exchange_deleter(&delete_host_visible, &keep_taken)) {
    return std::nullopt;
  }
  return take_host_visible(ptr.get());
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
