// Device memory (two views of one region per device), pinned host memory and
// synchronous copies.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "OpenRegRuntimeInternal.h"

namespace openreg {
namespace {

// cudaMalloc aligns to at least 256 bytes; 512 also covers any vector width
// a CPU kernel may use on device memory.
constexpr size_t kAlignment = 512;
// An allocation of kStaggerFrom bytes or more that would start right behind
// another one starts kStagger bytes later, where its free range has room: the
// gap stays free (small allocations may take it, it merges back on free), so
// consecutive large allocations do not start a power of two apart. CPU kernels
// ran 2-7% slower on operands exactly 64 MiB apart than on operands 64 MiB +
// 64 KiB or 66 MiB apart on this project's machine (AMD EPYC,
// docs/performance.md); the blocks glibc mmaps for CPU tensors of that size
// are not a power of two apart either.
constexpr size_t kStaggerFrom = size_t{2} << 20;
constexpr size_t kStagger = size_t{64} << 10;
constexpr size_t kHostAlignment = 64;

// The address-range allocator of one device: first fit over free ranges,
// coalesced on free. Offsets are relative to the device's region.
struct DeviceHeap {
  std::mutex mutex;
  std::map<size_t, size_t> free; // offset -> size
  struct Live {
    size_t size;    // bytes requested
    size_t rounded; // bytes reserved
    // Mapped from another process by orIpcOpenMemHandle: the heap range
    // [range, range + range_size) holds the other process's pages.
    bool imported = false;
    size_t range = 0;
    size_t range_size = 0;
    orIpcMemHandle source{}; // the handle it was opened from (fd: this process's copy, for export)
  };
  std::map<size_t, Live> live; // by offset
  size_t used = 0;
};

std::array<DeviceHeap, kMaxDevices>& heaps() {
  static auto* h = new std::array<DeviceHeap, kMaxDevices>(); // leaked: outlives static dtors
  return *h;
}

// The memfd behind every device's kernel view (-1 when memfd_create is not
// available: the kernel view is then private memory and cannot be shared),
// and an identity of this process's device memory, new in a forked child.
int memory_file = -1;
uint64_t memory_identity = 0;
uintptr_t kernel_view_base = 0;
size_t kernel_view_size = 0;

// The memory files of other processes that opened handles map, one
// descriptor per file (however many handles of it are open), kept so that
// memory received from another process can be sent on (orIpcGetMemHandle).
struct ImportedFile {
  int fd;
  int opened;
};
std::mutex& imported_files_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<std::pair<dev_t, ino_t>, ImportedFile>& imported_files() {
  static auto* f = new std::map<std::pair<dev_t, ino_t>, ImportedFile>();
  return *f;
}

// This process's descriptor of the file `fd` is open on, or -1.
int keep_imported_file(int fd, const struct stat& file) {
  std::lock_guard<std::mutex> lock(imported_files_mutex());
  auto [it, added] = imported_files().try_emplace({file.st_dev, file.st_ino}, ImportedFile{-1, 0});
  if (added) {
    it->second.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (it->second.fd < 0) {
      imported_files().erase(it);
      return -1;
    }
  }
  ++it->second.opened;
  return it->second.fd;
}

void drop_imported_file(int fd) {
  std::lock_guard<std::mutex> lock(imported_files_mutex());
  for (auto it = imported_files().begin(); it != imported_files().end(); ++it) {
    if (it->second.fd == fd) {
      if (--it->second.opened == 0) {
        close(fd);
        imported_files().erase(it);
      }
      return;
    }
  }
}

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

uint64_t new_memory_identity() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (static_cast<uint64_t>(getpid()) << 40) ^ (static_cast<uint64_t>(now.tv_sec) * 1000000000u) ^
      static_cast<uint64_t>(now.tv_nsec);
}

// Maps [addr, addr + size) of the kernel view to the same range of this
// process's memory file (private memory without one). MADV_DONTFORK: a forked
// child must not share device memory with its parent (its frees would punch
// holes in the parent's pages); replace_memory_in_child gives it its own.
bool map_own_memory(uintptr_t addr, size_t size) {
  const int prot = PROT_READ | PROT_WRITE;
  void* p = memory_file >= 0
      ? mmap(reinterpret_cast<void*>(addr), size, prot, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, memory_file,
             static_cast<off_t>(addr - kernel_view_base))
      : mmap(reinterpret_cast<void*>(addr), size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return false;
  }
  madvise(p, size, MADV_DONTFORK);
  return true;
}

// Gives the pages of the kernel-view range [addr, addr + size) (page-aligned)
// back to the host; the next use reads zeros. On shared memory
// MADV_DONTNEED would only drop this mapping's view of the pages: the hole
// punched in the file frees them (in every process that maps them).
void release_pages(uintptr_t addr, size_t size) {
  if (size == 0) {
    return;
  }
  if (memory_file >= 0) {
    fallocate(memory_file, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(addr - kernel_view_base),
              static_cast<off_t>(size));
  } else {
    madvise(reinterpret_cast<void*>(addr), size, MADV_DONTNEED);
  }
}

// pthread_atfork child handler: the kernel view was not inherited
// (MADV_DONTFORK); map a memory file of the child's own there. A child
// forked after openreg initialised cannot use it (OpenRegDevice.cpp), one
// forked before starts with empty device memory, as it did with private
// memory (nothing was allocated yet).
void replace_memory_in_child() {
  const int file = memfd_create("openreg-device-memory", MFD_CLOEXEC);
  if (file >= 0 && ftruncate(file, static_cast<off_t>(kernel_view_size)) == 0) {
    if (memory_file >= 0) {
      dup2(file, memory_file); // the descriptor keeps its number
      fcntl(memory_file, F_SETFD, FD_CLOEXEC);
      close(file);
    } else {
      memory_file = file;
    }
  } else {
    if (file >= 0) {
      close(file);
    }
    if (memory_file >= 0) {
      close(memory_file);
    }
    memory_file = -1;
  }
  memory_identity = new_memory_identity();
  if (!map_own_memory(kernel_view_base, kernel_view_size) && memory_file >= 0) {
    close(memory_file);
    memory_file = -1;
    map_own_memory(kernel_view_base, kernel_view_size);
  }
}

// Returns [start, start + size) of a device's region to its free ranges,
// coalescing with the free neighbours. Holds heap.mutex.
void release_range(DeviceHeap& heap, size_t start, size_t size) {
  auto next = heap.free.lower_bound(start);
  if (next != heap.free.end() && next->first == start + size) {
    size += next->second;
    next = heap.free.erase(next);
  }
  if (next != heap.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      heap.free.erase(prev);
    }
  }
  heap.free.emplace(start, size);
}

// Takes `size` bytes whose kernel-view address is page-aligned from a
// device's free ranges; `region` is the device's kernel-view start. Holds
// heap.mutex.
bool reserve_pages(DeviceHeap& heap, uintptr_t region, size_t size, size_t* offset) {
  const size_t page = page_size();
  for (auto it = heap.free.begin(); it != heap.free.end(); ++it) {
    const auto [start, length] = *it;
    const size_t aligned = (region + start + page - 1) / page * page - region;
    if (aligned + size > start + length) {
      continue;
    }
    heap.free.erase(it);
    if (aligned > start) {
      heap.free.emplace(start, aligned - start);
    }
    if (start + length > aligned + size) {
      heap.free.emplace(aligned + size, start + length - aligned - size);
    }
    *offset = aligned;
    return true;
  }
  return false;
}

// Pinned host blocks by start address.
std::mutex& host_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<uintptr_t, size_t>& host_blocks() {
  static auto* r = new std::map<uintptr_t, size_t>();
  return *r;
}

// The device whose region holds `addr`, or -1.
int device_of(const detail::Config& c, uintptr_t addr) {
  if (addr < c.device_base || addr >= c.device_base + c.device_memory * c.device_count) {
    return -1;
  }
  return static_cast<int>((addr - c.device_base) / c.device_memory);
}

bool find_live(DeviceHeap& heap, size_t offset, size_t* base, size_t* size) {
  auto it = heap.live.upper_bound(offset);
  if (it == heap.live.begin()) {
    return false;
  }
  --it;
  if (offset >= it->first + it->second.size) {
    return false;
  }
  *base = it->first;
  *size = it->second.size;
  return true;
}

// The device range [ptr, ptr + count) lies inside one live allocation.
bool live_range(const void* ptr, size_t count) {
  const detail::Config* c = detail::config();
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const int device = c == nullptr ? -1 : device_of(*c, addr);
  if (device < 0) {
    return false;
  }
  DeviceHeap& heap = heaps()[device];
  const size_t offset = addr - c->device_base - device * c->device_memory;
  size_t base = 0;
  size_t size = 0;
  std::lock_guard<std::mutex> lock(heap.mutex);
  return find_live(heap, offset, &base, &size) && offset + count <= base + size;
}

bool host_block(uintptr_t addr, uintptr_t* base, size_t* size) {
  auto& blocks = host_blocks();
  auto it = blocks.upper_bound(addr);
  if (it == blocks.begin()) {
    return false;
  }
  --it;
  if (addr >= it->first + it->second) {
    return false;
  }
  *base = it->first;
  *size = it->second;
  return true;
}

#if defined(__x86_64__)
// The CPU copies fast with `rep movsb` (cpuid leaf 7: ERMS, ebx bit 9).
bool has_erms() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (ebx & (1u << 9)) != 0;
}
#endif

} // namespace

namespace detail {

void copy_bytes(void* to, const void* from, size_t count) {
#if defined(__x86_64__)
  // Above the L2 cache's size glibc's memcpy leaves `rep movsb` for a vector
  // loop that moved 5-6% less per second than ATen's copy_ kernel on this
  // project's machine (2-core AMD EPYC, 64 MiB); `rep movsb` moved as much or
  // more (docs/performance.md). It copies forwards only, so only between
  // disjoint ranges here.
  static const bool erms = has_erms();
  constexpr size_t kRepMovsbMin = 512 * 1024;
  const auto dst = reinterpret_cast<uintptr_t>(to);
  const auto src = reinterpret_cast<uintptr_t>(from);
  if (erms && count >= kRepMovsbMin && (dst + count <= src || src + count <= dst)) {
    asm volatile("rep movsb" : "+D"(to), "+S"(from), "+c"(count) : : "memory");
    return;
  }
#endif
  std::memmove(to, from, count);
}

orError map_device_memory(Config& config, std::string* message) {
  const size_t total = config.device_memory * static_cast<size_t>(config.device_count);
  // MAP_NORESERVE: the region is address space until a kernel touches it, so
  // an 8 GiB device costs nothing until used.
  // The kernel view is a memory file mapped shared, so that another process
  // can map part of it (orIpcOpenMemHandle); without memfd_create it is
  // private memory, which cannot be shared.
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  memory_file = memfd_create("openreg-device-memory", MFD_CLOEXEC);
  if (memory_file >= 0 && ftruncate(memory_file, static_cast<off_t>(total)) != 0) {
    close(memory_file);
    memory_file = -1;
  }
  void* device_view = mmap(nullptr, total, PROT_NONE, flags, -1, 0);
  void* kernel_view = device_view == MAP_FAILED ? MAP_FAILED
      : memory_file >= 0 ? mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, memory_file, 0)
                         : mmap(nullptr, total, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (kernel_view == MAP_FAILED) {
    if (memory_file >= 0) {
      close(memory_file);
      memory_file = -1;
    }
    if (device_view != MAP_FAILED) {
      munmap(device_view, total);
    }
    *message = "openreg could not reserve " + std::to_string(total >> 20) + " MiB of address space for " +
        std::to_string(config.device_count) + " device(s): lower OPENREG_DEVICE_MEMORY or OPENREG_DEVICE_COUNT.";
    return orError::InvalidConfiguration;
  }
  config.device_base = reinterpret_cast<uintptr_t>(device_view);
  config.kernel_base = reinterpret_cast<uintptr_t>(kernel_view);
  kernel_view_base = config.kernel_base;
  kernel_view_size = total;
  memory_identity = new_memory_identity();
  madvise(kernel_view, total, MADV_DONTFORK);
  pthread_atfork(nullptr, nullptr, &replace_memory_in_child);
  for (int d = 0; d < config.device_count; ++d) {
    heaps()[d].free.emplace(0, config.device_memory);
  }
  return orError::Success;
}

orError check_copy(const void* dst, const void* src, size_t count, orMemcpyKind kind) {
  if (count == 0) {
    return orError::Success;
  }
  if (dst == nullptr || src == nullptr) {
    return orError::InvalidValue;
  }
  // Like cudaMemcpy with an explicit kind: the device side of the copy must be
  // a live device range, which catches stale pointers and overruns early; the
  // host side must not be a device address.
  const bool dst_device = kind == orMemcpyKind::HostToDevice || kind == orMemcpyKind::DeviceToDevice;
  const bool src_device = kind == orMemcpyKind::DeviceToHost || kind == orMemcpyKind::DeviceToDevice;
  const bool valid = (dst_device ? live_range(dst, count) : !orIsDeviceAddress(dst)) &&
      (src_device ? live_range(src, count) : !orIsDeviceAddress(src));
  return valid ? orError::Success : orError::InvalidPointer;
}

int device_of_address(const void* addr) {
  const Config* c = config();
  return c == nullptr ? -1 : device_of(*c, reinterpret_cast<uintptr_t>(addr));
}

bool find_allocation(uintptr_t addr, bool try_only, int* device, uintptr_t* base, size_t* size) {
  const Config* c = config();
  const int d = c == nullptr ? -1 : device_of(*c, addr);
  if (d < 0) {
    return false;
  }
  *device = d;
  DeviceHeap& heap = heaps()[d];
  std::unique_lock<std::mutex> lock(heap.mutex, std::defer_lock);
  if (try_only ? !lock.try_lock() : (lock.lock(), false)) {
    return false;
  }
  const uintptr_t region = c->device_base + d * c->device_memory;
  size_t offset = 0;
  if (!find_live(heap, addr - region, &offset, size)) {
    return false;
  }
  *base = region + offset;
  return true;
}

} // namespace detail

void* orKernelAddress(void* ptr) {
  return const_cast<void*>(orKernelAddress(static_cast<const void*>(ptr)));
}

const void* orKernelAddress(const void* ptr) {
  const detail::Config* c = detail::config();
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (c == nullptr || addr < c->device_base || addr - c->device_base >= c->device_memory * c->device_count) {
    return ptr;
  }
  return reinterpret_cast<const void*>(addr - c->device_base + c->kernel_base);
}

bool orIsDeviceAddress(const void* ptr) {
  const detail::Config* c = detail::config();
  return c != nullptr && device_of(*c, reinterpret_cast<uintptr_t>(ptr)) >= 0;
}

bool orDiscreteMemory() {
  const detail::Config* config = detail::config();
  return config != nullptr && config->discrete_memory;
}

orError orMalloc(void** ptr, size_t size) {
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
  const detail::Config& c = *detail::config();
  int device = 0;
  orGetDevice(&device);
  const size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < size) {
    return orError::MemoryAllocation;
  }
  DeviceHeap& heap = heaps()[device];
  std::lock_guard<std::mutex> lock(heap.mutex);
  for (auto it = heap.free.begin(); it != heap.free.end(); ++it) {
    if (it->second < rounded) {
      continue;
    }
    const auto [start, length] = *it;
    // Free ranges are coalesced, so one that does not start at 0 follows an
    // allocation.
    const size_t gap = rounded >= kStaggerFrom && start != 0 && length - rounded >= kStagger ? kStagger : 0;
    const size_t offset = start + gap;
    const size_t remaining = length - gap - rounded;
    heap.free.erase(it);
    if (gap > 0) {
      heap.free.emplace(start, gap);
    }
    if (remaining > 0) {
      heap.free.emplace(offset + rounded, remaining);
    }
    heap.live.emplace(offset, DeviceHeap::Live{size, rounded});
    heap.used += rounded;
    *ptr = reinterpret_cast<void*>(c.device_base + device * c.device_memory + offset);
    return orError::Success;
  }
  return orError::MemoryAllocation;
}

namespace {
// Where device address `ptr` lies, for a call that gives its memory back.
struct DeviceRange {
  const detail::Config* config;
  int device;
  size_t offset; // in the device's heap
};

// The range of `ptr` (false if it is no device address), once every stream of
// its device has finished: as cudaFree, queued kernels and copies may still
// read or write the memory.
bool device_range_to_release(const void* ptr, DeviceRange* out) {
  const detail::Config* c = detail::config();
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const int device = c == nullptr ? -1 : device_of(*c, addr);
  if (device < 0) {
    return false;
  }
  detail::wait_device_streams(device);
  *out = DeviceRange{c, device, addr - c->device_base - device * c->device_memory};
  return true;
}
} // namespace

orError orFree(void* ptr) {
  if (ptr == nullptr) {
    return orError::Success;
  }
  DeviceRange where{};
  if (!device_range_to_release(ptr, &where)) {
    return orError::InvalidPointer;
  }
  const detail::Config* c = where.config;
  const int device = where.device;
  const size_t offset = where.offset;
  DeviceHeap& heap = heaps()[device];
  std::lock_guard<std::mutex> lock(heap.mutex);
  auto live = heap.live.find(offset);
  if (live == heap.live.end() || live->second.imported) {
    return orError::InvalidPointer; // memory from another process: orIpcCloseMemHandle
  }
  const size_t size = live->second.rounded;
  heap.live.erase(live);
  heap.used -= size;
  // Give the pages back to the host; the next allocation reads zeros. Only
  // whole pages: the ones at the ends may hold a neighbour's bytes.
  const uintptr_t page = page_size();
  const uintptr_t kernel = c->kernel_base + device * c->device_memory + offset;
  const uintptr_t first = (kernel + page - 1) / page * page;
  const uintptr_t last = (kernel + size) / page * page;
  if (last > first) {
    release_pages(first, last - first);
  }
  release_range(heap, offset, size);
  return orError::Success;
}

orError orMemDiscard(void* ptr, size_t size) {
  if (!live_range(ptr, size)) {
    return orError::InvalidPointer;
  }
  const detail::Config* c = detail::config();
  const uintptr_t page = page_size();
  const uintptr_t kernel = c->kernel_base + (reinterpret_cast<uintptr_t>(ptr) - c->device_base);
  const uintptr_t first = (kernel + page - 1) / page * page;
  const uintptr_t last = (kernel + size) / page * page;
  if (last > first) {
    release_pages(first, last - first);
  }
  return orError::Success;
}

orError orIpcGetMemHandle(orIpcMemHandle* handle, const void* ptr) {
  if (handle == nullptr) {
    return orError::InvalidValue;
  }
  *handle = orIpcMemHandle{};
  const detail::Config* c = detail::config();
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const int device = c == nullptr ? -1 : device_of(*c, addr);
  if (device < 0) {
    return orError::InvalidPointer;
  }
  DeviceHeap& heap = heaps()[device];
  const size_t offset = addr - c->device_base - device * c->device_memory;
  std::lock_guard<std::mutex> lock(heap.mutex);
  auto it = heap.live.upper_bound(offset);
  if (it == heap.live.begin()) {
    return orError::InvalidPointer;
  }
  --it;
  if (offset >= it->first + std::max<size_t>(it->second.size, 1)) {
    return orError::InvalidPointer;
  }
  if (it->second.imported) {
    // Received from another process: send on the handle it came with, so
    // that the receiver maps the producer's memory (the sender's storage,
    // kept alive while the receiver holds it, keeps its own mapping and so
    // the producer's reference).
    *handle = it->second.source;
    return orError::Success;
  }
  if (memory_file < 0) {
    return orError::InvalidValue;
  }
  const uintptr_t page = page_size();
  const uintptr_t kernel = c->kernel_base + device * c->device_memory + it->first;
  const uintptr_t first = kernel / page * page;
  const uintptr_t last = (kernel + it->second.rounded + page - 1) / page * page;
  handle->fd = memory_file;
  handle->device = device;
  handle->offset = first - kernel_view_base;
  handle->size = last - first;
  handle->base = kernel - first;
  handle->process = static_cast<uint64_t>(getpid());
  handle->memory = memory_identity;
  return orError::Success;
}

orError orIpcOpenMemHandle(void** ptr, const orIpcMemHandle& handle) {
  if (ptr == nullptr) {
    return orError::InvalidValue;
  }
  *ptr = nullptr;
  if (orError status = detail::check_device(handle.device); status != orError::Success) {
    return status;
  }
  const size_t page = page_size();
  struct stat file{};
  if (handle.fd < 0 || handle.size == 0 || handle.offset % page != 0 || handle.size % page != 0 ||
      handle.base >= handle.size || fstat(handle.fd, &file) != 0 ||
      static_cast<uint64_t>(file.st_size) < handle.offset + handle.size) {
    return orError::InvalidHandle;
  }
  const detail::Config& c = *detail::config();
  if (handle.size > c.device_memory) {
    return orError::MemoryAllocation;
  }
  DeviceHeap& heap = heaps()[handle.device];
  const uintptr_t region = c.kernel_base + handle.device * c.device_memory;
  std::lock_guard<std::mutex> lock(heap.mutex);
  size_t range = 0;
  if (!reserve_pages(heap, region, handle.size, &range)) {
    return orError::MemoryAllocation;
  }
  orIpcMemHandle source = handle;
  source.fd = keep_imported_file(handle.fd, file);
  if (source.fd < 0) {
    release_range(heap, range, handle.size);
    return orError::InvalidHandle;
  }
  void* mapped = mmap(reinterpret_cast<void*>(region + range), handle.size, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED | MAP_NORESERVE, handle.fd, static_cast<off_t>(handle.offset));
  if (mapped == MAP_FAILED) {
    map_own_memory(region + range, handle.size); // MAP_FIXED may have unmapped it
    release_range(heap, range, handle.size);
    drop_imported_file(source.fd);
    return orError::InvalidHandle;
  }
  madvise(mapped, handle.size, MADV_DONTFORK);
  const size_t start = range + handle.base;
  const size_t bytes = handle.size - handle.base;
  heap.live.emplace(start, DeviceHeap::Live{bytes, bytes, true, range, handle.size, source});
  heap.used += handle.size;
  *ptr = reinterpret_cast<void*>(c.device_base + handle.device * c.device_memory + start);
  return orError::Success;
}

orError orIpcCloseMemHandle(void* ptr) {
  DeviceRange where{};
  if (!device_range_to_release(ptr, &where)) {
    return orError::InvalidPointer;
  }
  const detail::Config* c = where.config;
  const int device = where.device;
  DeviceHeap& heap = heaps()[device];
  std::lock_guard<std::mutex> lock(heap.mutex);
  const size_t offset = where.offset;
  auto live = heap.live.find(offset);
  if (live == heap.live.end() || !live->second.imported) {
    return orError::InvalidPointer;
  }
  const size_t range = live->second.range;
  const size_t size = live->second.range_size;
  drop_imported_file(live->second.source.fd);
  heap.live.erase(live);
  heap.used -= size;
  // This process's own pages go back under the range, empty.
  const uintptr_t kernel = c->kernel_base + device * c->device_memory + range;
  release_pages(kernel, size);
  if (!map_own_memory(kernel, size)) {
    return orError::MemoryAllocation; // the range stays reserved: it maps nothing usable
  }
  release_range(heap, range, size);
  return orError::Success;
}

orError orMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) {
    return orError::InvalidValue;
  }
  if (orError status = orInit(); status != orError::Success) {
    return status;
  }
  int device = 0;
  orGetDevice(&device);
  const size_t capacity = detail::config()->device_memory;
  DeviceHeap& heap = heaps()[device];
  std::lock_guard<std::mutex> lock(heap.mutex);
  *total = capacity;
  *free = capacity - heap.used;
  return orError::Success;
}

orError orMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) {
    return orError::InvalidValue;
  }
  *ptr = nullptr;
  if (size == 0) {
    return orError::Success;
  }
  const size_t rounded = (size + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* p = std::aligned_alloc(kHostAlignment, rounded);
  if (p == nullptr) {
    return orError::MemoryAllocation;
  }
  std::lock_guard<std::mutex> lock(host_mutex());
  host_blocks()[reinterpret_cast<uintptr_t>(p)] = size;
  *ptr = p;
  return orError::Success;
}

orError orFreeHost(void* ptr) {
  if (ptr == nullptr) {
    return orError::Success;
  }
  {
    std::lock_guard<std::mutex> lock(host_mutex());
    if (host_blocks().erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      return orError::InvalidPointer;
    }
  }
  std::free(ptr);
  return orError::Success;
}

orError orPointerGetAttributes(orPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) {
    return orError::InvalidValue;
  }
  *attributes = orPointerAttributes{};
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  int device = -1;
  uintptr_t base = 0;
  size_t size = 0;
  if (detail::find_allocation(addr, /*try_only=*/false, &device, &base, &size)) {
    attributes->is_device = true;
    attributes->device = device;
  } else {
    std::lock_guard<std::mutex> lock(host_mutex());
    if (!host_block(addr, &base, &size)) {
      return orError::Success;
    }
    attributes->is_pinned_host = true;
  }
  attributes->base = reinterpret_cast<void*>(base);
  attributes->size = size;
  return orError::Success;
}

orError orMemcpy(void* dst, const void* src, size_t count, orMemcpyKind kind) {
  if (const orError err = detail::check_copy(dst, src, count, kind); err != orError::Success || count == 0) {
    return err;
  }
  const orActivityCallback report = detail::activity_callback();
  orActivityMemcpy record{};
  if (report != nullptr) {
    record = detail::memcpy_record(dst, src, count, kind, nullptr);
    record.start_ns = orActivityGetTimestamp();
  }
  detail::copy_bytes(orKernelAddress(dst), orKernelAddress(src), count);
  if (report != nullptr) {
    record.end_ns = orActivityGetTimestamp();
    report(record);
  }
  return orError::Success;
}

} // namespace openreg
