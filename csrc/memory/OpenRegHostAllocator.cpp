// The pinned host allocator: torch's own caching machinery
// (ATen/core/CachingHostAllocator.h, as CUDA and XPU use it) over the
// runtime's page-locked memory. A pinned block that an asynchronous copy used
// is only reused once that copy's stream has passed an event recorded at
// free time (Copy.cpp records the stream through record_event).
#include "memory/OpenRegHostAllocator.h"

#include <cstring>

#include <ATen/core/CachingHostAllocator.h>

#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"
#include "device/OpenRegStream.h"

namespace openreg {
namespace {

// A movable owner of one runtime event, the E of CachingHostAllocatorImpl.
class HostEvent {
 public:
  HostEvent() {
    OPENREG_CHECK(orEventCreateWithFlags(&event_, orEventDisableTiming));
  }
  HostEvent(HostEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  HostEvent& operator=(HostEvent&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
  }
  HostEvent(const HostEvent&) = delete;
  HostEvent& operator=(const HostEvent&) = delete;
  ~HostEvent() {
    if (event_ != nullptr) {
      (void)orEventDestroy(event_);
    }
  }

  void record(const c10::Stream& stream) {
    OPENREG_CHECK(orEventRecord(event_, raw_stream(stream)));
  }

  bool query() const {
    const orError status = orEventQuery(event_);
    if (status == orError::NotReady) {
      return false;
    }
    OPENREG_CHECK(status);
    return true;
  }

 private:
  orEvent_t event_ = nullptr;
};

struct PinnedCache final : public at::CachingHostAllocatorImpl<c10::Stream, HostEvent> {
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  void allocate_host_memory(size_t size, void** ptr) override {
    const orError status = orMallocHost(ptr, size);
    TORCH_CHECK_WITH(
        OutOfMemoryError, status != orError::MemoryAllocation, "openreg could not allocate ", size,
        " bytes of pinned host memory: free pinned tensors or call torch.accelerator.empty_host_cache().");
    OPENREG_CHECK(status);
  }

  void free_block(at::HostBlock<c10::Stream>* block) override {
    OPENREG_CHECK(orFreeHost(block->ptr_));
  }

  void record_stream(std::optional<std::vector<HostEvent>>& events, c10::Stream stream) override {
    HostEvent event;
    event.record(stream);
    events->push_back(std::move(event));
  }

  bool query_event(HostEvent& event) override {
    return event.query();
  }

  c10::Stream get_current_stream() const override {
    return current_stream(current_device());
  }

  bool stream_is_capturing(c10::Stream /*stream*/) const override {
    return false; // openreg has no graph capture
  }

  bool pinned_use_background_threads() override {
    return false;
  }
};

void delete_pinned(void* ctx);

struct PinnedHostAllocator final : public at::CachingHostAllocatorInterface<PinnedCache, delete_pinned> {};

PinnedHostAllocator& instance() {
  static auto* allocator = new PinnedHostAllocator(); // leaked: pinned tensors may outlive static dtors
  return *allocator;
}

void delete_pinned(void* ctx) {
  instance().free(ctx);
}

// torch.accelerator.empty_host_cache and host memory stats find it here.
struct RegisterHostAllocator {
  RegisterHostAllocator() {
    at::setHostAllocator(c10::DeviceType::PrivateUse1, &instance());
  }
};
const RegisterHostAllocator register_host_allocator;

} // namespace

at::HostAllocator* pinned_host_allocator() {
  return &instance();
}

} // namespace openreg
