#include "OpenRegRuntime.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace openreg {
namespace {

// Device memory is host memory in this simulation; 64-byte alignment matches
// what ATen's CPU allocator gives, so vectorised CPU kernels run on it unchanged.
constexpr size_t kAlignment = 64;

constexpr int kPinnedHost = -1; // Allocation::device of pinned host memory

struct Allocation {
  size_t size;
  int device; // owning device, or kPinnedHost

  bool pinned_host() const {
    return device == kPinnedHost;
  }
};

struct DeviceTable {
  std::once_flag once;
  orError status = orError::Success;
  std::string message;
  int count = 0;
};

DeviceTable& devices() {
  static DeviceTable table;
  return table;
}

// Live allocations by start address; ordered so that an interior pointer can be
// resolved to its allocation with upper_bound.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<uintptr_t, Allocation>& registry() {
  static auto* r = new std::map<uintptr_t, Allocation>(); // leaked: outlives static dtors
  return *r;
}

thread_local int current_device = 0;

void read_device_count(DeviceTable& table) {
  const char* env = std::getenv("OPENREG_DEVICE_COUNT");
  if (env == nullptr || *env == '\0') {
    table.count = kDefaultDeviceCount;
    return;
  }
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || value < 1 || value > kMaxDevices) {
    table.status = orError::InvalidConfiguration;
    table.message = std::string("OPENREG_DEVICE_COUNT='") + env +
        "' is not a whole number from 1 to " + std::to_string(kMaxDevices) +
        ": set it to the number of simulated openreg devices you want, or unset it for the default of " +
        std::to_string(kDefaultDeviceCount) + ".";
  } else {
    table.count = static_cast<int>(value);
  }
}

bool lookup(uintptr_t p, uintptr_t* base, Allocation* out) {
  auto& r = registry();
  auto it = r.upper_bound(p);
  if (it == r.begin()) {
    return false;
  }
  --it;
  // A zero-size allocation never holds a pointer, so `<` is exact here.
  if (p < it->first || p >= it->first + it->second.size) {
    return false;
  }
  *base = it->first;
  *out = it->second;
  return true;
}

} // namespace

const char* orGetErrorString(orError error) {
  switch (error) {
    case orError::Success: return "no error";
    case orError::InvalidDevice: return "invalid openreg device index";
    case orError::InvalidValue: return "invalid argument";
    case orError::MemoryAllocation: return "out of memory";
    case orError::InvalidPointer: return "pointer is not inside a live openreg allocation";
    case orError::InvalidConfiguration: return "invalid openreg configuration";
  }
  return "unknown openreg error";
}

orError orInit(const char** message) {
  auto& table = devices();
  std::call_once(table.once, [&] { read_device_count(table); });
  if (message != nullptr) {
    *message = table.message.c_str();
  }
  return table.status;
}

orError orGetDeviceCount(int* count) {
  if (count == nullptr) {
    return orError::InvalidValue;
  }
  orError status = orInit();
  *count = status == orError::Success ? devices().count : 0;
  return status;
}

orError orGetDevice(int* device) {
  if (device == nullptr) {
    return orError::InvalidValue;
  }
  *device = current_device;
  return orError::Success;
}

orError orSetDevice(int device) {
  int count = 0;
  if (orError status = orGetDeviceCount(&count); status != orError::Success) {
    return status;
  }
  if (device < 0 || device >= count) {
    return orError::InvalidDevice;
  }
  current_device = device;
  return orError::Success;
}

namespace {

orError allocate(void** ptr, size_t size, int device) {
  if (ptr == nullptr) {
    return orError::InvalidValue;
  }
  *ptr = nullptr;
  if (orError status = orInit(); status != orError::Success) {
    return status;
  }
  if (size == 0) {
    return orError::Success;
  }
  size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    return orError::MemoryAllocation;
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry()[reinterpret_cast<uintptr_t>(p)] = Allocation{size, device};
  }
  *ptr = p;
  return orError::Success;
}

orError release(void* ptr, bool host) {
  if (ptr == nullptr) {
    return orError::Success;
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == registry().end() || it->second.pinned_host() != host) {
      return orError::InvalidPointer;
    }
    registry().erase(it);
  }
  std::free(ptr);
  return orError::Success;
}

} // namespace

orError orMalloc(void** ptr, size_t size) {
  return allocate(ptr, size, current_device);
}

orError orFree(void* ptr) {
  return release(ptr, /*host=*/false);
}

orError orMallocHost(void** ptr, size_t size) {
  return allocate(ptr, size, kPinnedHost);
}

orError orFreeHost(void* ptr) {
  return release(ptr, /*host=*/true);
}

orError orPointerGetAttributes(orPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) {
    return orError::InvalidValue;
  }
  *attributes = orPointerAttributes{};
  uintptr_t base = 0;
  Allocation allocation{};
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (lookup(reinterpret_cast<uintptr_t>(ptr), &base, &allocation)) {
    attributes->is_device = !allocation.pinned_host();
    attributes->is_pinned_host = allocation.pinned_host();
    attributes->device = allocation.device;
    attributes->base = reinterpret_cast<void*>(base);
    attributes->size = allocation.size;
  }
  return orError::Success;
}

orError orMemcpy(void* dst, const void* src, size_t count, orMemcpyKind kind) {
  if (count == 0) {
    return orError::Success;
  }
  if (dst == nullptr || src == nullptr) {
    return orError::InvalidValue;
  }
  // Like cudaMemcpy with an explicit kind: the device side of the copy must be
  // a live device range, which catches stale pointers and overruns early.
  auto check_device_range = [](const void* p, size_t n) {
    uintptr_t base = 0;
    Allocation allocation{};
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto addr = reinterpret_cast<uintptr_t>(p);
    return lookup(addr, &base, &allocation) && !allocation.pinned_host() &&
        addr + n <= base + allocation.size;
  };
  bool dst_device = kind == orMemcpyKind::HostToDevice || kind == orMemcpyKind::DeviceToDevice;
  bool src_device = kind == orMemcpyKind::DeviceToHost || kind == orMemcpyKind::DeviceToDevice;
  if ((dst_device && !check_device_range(dst, count)) ||
      (src_device && !check_device_range(src, count))) {
    return orError::InvalidPointer;
  }
  std::memmove(dst, src, count);
  return orError::Success;
}

orError orDeviceSynchronize(int device) {
  int count = 0;
  if (orError status = orGetDeviceCount(&count); status != orError::Success) {
    return status;
  }
  return device >= 0 && device < count ? orError::Success : orError::InvalidDevice;
}

} // namespace openreg
