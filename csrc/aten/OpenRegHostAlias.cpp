#include "OpenRegHostAlias.h"

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/core/TensorBase.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include "aten/OpenRegAllocator.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {
namespace {

// An alias holds a reference to the device StorageImpl itself (no separate
// keep-alive object to allocate per alias).
void release_device_storage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// A lock for the registry's short critical sections (a search and a move;
// no device memory is freed inside): taking it when free is one atomic exchange, where a
// std::mutex costs a lock and an unlock call twice per kernel call here
// (adding an allocation, taking it back).
class SpinLock {
 public:
  void lock() noexcept {
    while (busy_.test_and_set(std::memory_order_acquire)) {
      std::this_thread::yield();
    }
  }
  void unlock() noexcept {
    busy_.clear(std::memory_order_release);
  }

 private:
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
};

// Device memory handed out as host-visible CPU DataPtrs (allocate_host_visible),
// by kernel address. The CPU DataPtrs have their data as context, as
// Allocator::raw_allocate requires (mkldnn and others allocate raw memory
// through the CPU allocator while a HostCall redirects it). Entries live from
// a kernel's allocation to its result's adoption (or the kernel freeing a
// temporary), so there are few: a flat list, searched from its newest end.
struct HostVisible {
  SpinLock lock;
  std::vector<std::pair<void*, c10::DataPtr>> memory;
};

HostVisible& host_visible() {
  static auto* registry = new HostVisible(); // leaked: deleters may run at exit
  return *registry;
}

std::optional<c10::DataPtr> take_host_visible(void* data) {
  HostVisible& r = host_visible();
  const std::lock_guard<SpinLock> lock(r.lock);
  for (size_t i = r.memory.size(); i-- > 0;) {
    if (r.memory[i].first == data) {
      c10::DataPtr device = std::move(r.memory[i].second);
      if (i + 1 != r.memory.size()) {
        r.memory[i] = std::move(r.memory.back());
      }
      r.memory.pop_back();
      return device;
    }
  }
  return std::nullopt;
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

// Host alias objects that nothing references any more, for reuse on this
// thread (recycle_host_alias, recycle_host_alias_storage).
constexpr size_t kRecycled = 8;
struct Recycled {
  c10::SmallVector<c10::intrusive_ptr<c10::TensorImpl>, kRecycled> tensors;
  c10::SmallVector<c10::intrusive_ptr<c10::StorageImpl>, kRecycled> storages;
};
thread_local Recycled recycled;

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
  c10::DataPtr device = allocate_on(index, nbytes);
  if (device.get() == nullptr) {
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
  }
  void* data = orKernelAddress(device.get());
  {
    HostVisible& r = host_visible();
    const std::lock_guard<SpinLock> lock(r.lock);
    r.memory.emplace_back(data, std::move(device));
  }
  return c10::DataPtr(data, data, &delete_host_visible, c10::Device(c10::DeviceType::CPU));
}

c10::Storage host_alias_storage(const c10::Storage& device_storage) {
  c10::StorageImpl* keep_alive = device_storage.unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(keep_alive);
  void* data = orKernelAddress(device_storage.unsafeGetStorageImpl()->data_ptr().get());
  c10::DataPtr ptr(data, keep_alive, &release_device_storage, c10::Device(c10::DeviceType::CPU));
  const c10::DeviceIndex index = device_storage.device().has_index() ? device_storage.device().index() : 0;
  if (!recycled.storages.empty()) {
    c10::intrusive_ptr<c10::StorageImpl> impl = std::move(recycled.storages.back());
    recycled.storages.pop_back();
    impl->set_data_ptr_noswap(std::move(ptr));
    impl->set_nbytes(device_storage.nbytes());
    impl->set_allocator(growth_allocator(index));
    return c10::Storage(std::move(impl));
  }
  return c10::Storage(
      c10::Storage::use_byte_size_t(), device_storage.nbytes(), std::move(ptr),
      growth_allocator(index), /*resizable=*/true);
}

void recycle_host_alias(at::Tensor&& alias) {
  // Only an alias as host_alias made it: one a kernel froze (detach-like
  // metadata locks) or marked as a wrapped number is left to be freed.
  if (!alias.defined() || alias.use_count() != 1 || alias.weak_use_count() != 1 ||
      recycled.tensors.size() == kRecycled || !alias.unsafeGetTensorImpl()->allow_tensor_metadata_change() ||
      alias.unsafeGetTensorImpl()->is_wrapped_number()) {
    return;
  }
  c10::intrusive_ptr<c10::TensorImpl> impl = alias.getIntrusivePtr();
  alias.reset();
  impl->release_resources(); // drops the storage (and anything a kernel attached)
  recycled.tensors.push_back(std::move(impl));
}

void recycle_host_alias_storage(c10::Storage&& host_storage) {
  c10::StorageImpl* impl = host_storage.unsafeGetStorageImpl();
  // Only a storage still over the operand's memory: one a kernel resized owns
  // other memory (take_grown_device_memory).
  if (impl == nullptr || host_storage.use_count() != 1 || c10::raw::weak_intrusive_ptr::use_count(impl) != 1 ||
      impl->data_ptr().get_deleter() != &release_device_storage || !impl->resizable() ||
      recycled.storages.size() == kRecycled) {
    return;
  }
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU))); // the device memory's reference
  impl->set_nbytes(0);
  recycled.storages.push_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
  host_storage = c10::Storage();
}

std::optional<c10::DataPtr> take_grown_device_memory(const c10::Storage& host_storage) {
  c10::DataPtr& ptr = host_storage.unsafeGetStorageImpl()->_mutable_data_ptr_no_checks();
  // The host storage keeps pointing at the bytes; the device storage owns them now.
  if (!ptr.compare_exchange_deleter(&delete_host_visible, &keep_taken)) {
    return std::nullopt;
  }
  return take_host_visible(ptr.get());
}

at::Tensor host_alias(const at::TensorBase& t, const c10::Storage& host_storage) {
  at::Tensor alias;
  if (!recycled.tensors.empty()) {
    c10::intrusive_ptr<c10::TensorImpl> impl = std::move(recycled.tensors.back());
    recycled.tensors.pop_back();
    impl->set_storage_and_dtype(host_storage, t.dtype());
    alias = at::Tensor(std::move(impl));
  } else {
    alias = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(host_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  }
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
  return alias;
}

} // namespace openreg
