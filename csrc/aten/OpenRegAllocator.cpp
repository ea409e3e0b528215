#include "OpenRegAllocator.h"

#include <array>
#include <mutex>

#include <c10/core/DeviceGuard.h>

#include "OpenRegDevice.h"
#include "OpenRegException.h"

namespace openreg {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::StatType;

// What a DataPtr's context remembers, so the deleter can update the stats of
// the device the memory came from.
struct Block {
  void* ptr;
  size_t size;
  c10::DeviceIndex device;
};

// Without a cache (that arrives with the runtime issue) every allocation is its
// own segment and reserved memory equals allocated memory.
class OpenRegAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    void* ptr = nullptr;
    const orError status = orMalloc(&ptr, nbytes);
    TORCH_CHECK_WITH(
        OutOfMemoryError, status != orError::MemoryAllocation,
        "openreg out of memory: tried to allocate ", nbytes, " bytes on openreg:",
        static_cast<int>(device), ".");
    OPENREG_CHECK(status);
    if (nbytes == 0) {
      return {nullptr, nullptr, &delete_block, c10::Device(c10::DeviceType::PrivateUse1, device)};
    }
    record(device, static_cast<int64_t>(nbytes));
    auto* block = new Block{ptr, nbytes, device};
    return {ptr, block, &delete_block, c10::Device(c10::DeviceType::PrivateUse1, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr; // contexts differ from data pointers, so no raw deleter
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    OPENREG_CHECK(orMemcpy(dest, src, count, orMemcpyKind::DeviceToDevice));
  }

  bool initialized() override {
    return is_initialized();
  }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    // Nothing is cached: freed blocks go straight back to the runtime.
  }

  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {
    // Each device has one in-order stream, so no cross-stream reuse can happen.
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_[device];
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& s = stats_[device];
    for_each_stat(s, [](c10::CachingDeviceAllocator::Stat& stat) { stat.reset_accumulated(); });
    s.num_alloc_retries = 0;
    s.num_ooms = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    for_each_stat(stats_[device], [](c10::CachingDeviceAllocator::Stat& stat) { stat.reset_peak(); });
  }

  void release(const Block& block) {
    OPENREG_CHECK(orFree(block.ptr));
    record(block.device, -static_cast<int64_t>(block.size));
  }

 private:
  static void delete_block(void* ctx);

  template <typename Fn>
  static void for_each_stat(DeviceStats& s, Fn fn) {
    for (auto* array : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes,
                        &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
      for (auto& stat : *array) {
        fn(stat);
      }
    }
  }

  void record(c10::DeviceIndex device, int64_t delta) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& s = stats_[device];
    const int64_t count = delta > 0 ? 1 : -1;
    const size_t agg = static_cast<size_t>(StatType::AGGREGATE);
    for (auto* array : {&s.allocation, &s.segment, &s.active}) {
      (*array)[agg].increase(count);
    }
    for (auto* array : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
      (*array)[agg].increase(delta);
    }
  }

  std::mutex mutex_;
  std::array<DeviceStats, kMaxDevices> stats_;
};

OpenRegAllocator& allocator_instance() {
  static OpenRegAllocator instance;
  return instance;
}

void OpenRegAllocator::delete_block(void* ctx) {
  if (ctx == nullptr) {
    return;
  }
  auto* block = static_cast<Block*>(ctx);
  allocator_instance().release(*block);
  delete block;
}

// REGISTER_ALLOCATOR (c10/core/Allocator.h) installs it for every PrivateUse1 storage.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &allocator_instance());

} // namespace

c10::DeviceAllocator* device_allocator() {
  return &allocator_instance();
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes) {
  TORCH_CHECK(
      storage->resizable(),
      "Trying to resize storage that is not resizable (it wraps memory openreg does not own).");
  const c10::Device device = storage->device();
  TORCH_INTERNAL_ASSERT(device.is_privateuseone(), "resize_storage_bytes got a ", device, " storage");
  c10::DeviceGuard guard(device);
  c10::Allocator* alloc = storage->allocator() != nullptr ? storage->allocator() : device_allocator();
  c10::DataPtr fresh = alloc->allocate(new_nbytes);
  const size_t keep = std::min(storage->nbytes(), new_nbytes);
  if (keep > 0) {
    OPENREG_CHECK(orMemcpy(fresh.get(), storage->data(), keep, orMemcpyKind::DeviceToDevice));
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(new_nbytes);
}

} // namespace openreg
