#include "OpenRegHostAllocator.h"

#include <cstring>

#include "OpenRegException.h"

namespace openreg {
namespace {

// No cache yet: every pinned block goes straight to and from the runtime.
class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    const orError status = orMallocHost(&ptr, nbytes);
    TORCH_CHECK_WITH(
        OutOfMemoryError, status != orError::MemoryAllocation,
        "openreg could not allocate ", nbytes, " bytes of pinned host memory.");
    OPENREG_CHECK(status);
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  static void release(void* ptr) {
    // A deleter must not throw; the pointer came from orMallocHost.
    (void)orFreeHost(ptr);
  }
};

} // namespace

c10::Allocator* pinned_host_allocator() {
  static PinnedHostAllocator instance;
  return &instance;
}

} // namespace openreg
