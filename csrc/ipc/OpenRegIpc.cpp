#include "ipc/OpenRegIpc.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "device/OpenRegException.h"

namespace openreg::ipc {
namespace {

constexpr size_t kCounterBytes = sizeof(std::atomic<int64_t>);

std::atomic<int64_t>* map_counter(int file) {
  void* p = mmap(nullptr, kCounterBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file, 0);
  TORCH_CHECK(p != MAP_FAILED, "openreg could not map the reference count of a shared storage: ", std::strerror(errno));
  return static_cast<std::atomic<int64_t>*>(p);
}

// The receiver's DataPtr context: the opened allocation and the send's count.
struct Opened {
  void* allocation;
  std::atomic<int64_t>* counter;
};

void close_opened(void* context) {
  auto* opened = static_cast<Opened*>(context);
  // A deleter cannot throw; a failure here leaves the range mapped (no
  // corruption: it is still reserved).
  (void)orIpcCloseMemHandle(opened->allocation);
  opened->counter->fetch_sub(1, std::memory_order_acq_rel);
  munmap(opened->counter, kCounterBytes);
  delete opened;
}

} // namespace

SentStorage::SentStorage(c10::Storage storage) : storage_(std::move(storage)) {
  const c10::Device device = storage_.device();
  TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, "openreg IPC shares openreg storages, not ", device, " ones.");
  const void* data = storage_.data();
  orPointerAttributes attributes;
  OPENREG_CHECK(orPointerGetAttributes(&attributes, data));
  const auto start = reinterpret_cast<uintptr_t>(data);
  const auto base = reinterpret_cast<uintptr_t>(attributes.base);
  TORCH_CHECK(
      attributes.is_device && start + storage_.nbytes() <= base + attributes.size,
      "Cannot share this openreg storage with another process: its memory (", data, ", ", storage_.nbytes(),
      " bytes) is not inside one allocation of openreg's device memory. Send a copy instead (tensor.clone()).");
  const orError status = orIpcGetMemHandle(&handle_, data);
  TORCH_CHECK(
      status != orError::InvalidValue,
      "Cannot share openreg memory between processes here: the runtime could not back device memory with a "
      "memory file (memfd_create failed when it started).");
  OPENREG_CHECK(status);
  storage_offset_ = start - base;

  counter_file_ = memfd_create("openreg-ipc-refcount", MFD_CLOEXEC);
  TORCH_CHECK(counter_file_ >= 0, "openreg could not create the reference count of a shared storage: ", std::strerror(errno));
  if (ftruncate(counter_file_, kCounterBytes) != 0) {
    const int error = errno;
    close(counter_file_);
    counter_file_ = -1;
    TORCH_CHECK(false, "openreg could not size the reference count of a shared storage: ", std::strerror(error));
  }
  counter_ = map_counter(counter_file_);
  counter_->store(1, std::memory_order_release); // the receiver's reference
}

SentStorage::~SentStorage() {
  close_counter_file();
  if (counter_ != nullptr) {
    munmap(counter_, kCounterBytes);
  }
}

void SentStorage::close_counter_file() {
  if (counter_file_ >= 0) {
    close(counter_file_);
    counter_file_ = -1;
  }
}

bool SentStorage::released() const {
  return counter_->load(std::memory_order_acquire) <= 0;
}

c10::Storage open_storage(const orIpcMemHandle& handle, uint64_t storage_offset, uint64_t nbytes, int counter_file) {
  std::atomic<int64_t>* counter = map_counter(counter_file);
  void* allocation = nullptr;
  const bool inside = handle.base + storage_offset + nbytes <= handle.size;
  const orError status = inside ? orIpcOpenMemHandle(&allocation, handle) : orError::InvalidHandle;
  if (status != orError::Success) {
    // This receiver will never hold the memory: the sender need not keep it.
    counter->fetch_sub(1, std::memory_order_acq_rel);
    munmap(counter, kCounterBytes);
    TORCH_CHECK(
        status != orError::InvalidDevice, "openreg IPC: the storage is on openreg:", handle.device,
        " but this process has fewer openreg devices (OPENREG_DEVICE_COUNT).");
    TORCH_CHECK(
        status != orError::MemoryAllocation, "openreg IPC: openreg:", handle.device, " of this process has no free range of ",
        handle.size, " bytes to map the shared storage into.");
    TORCH_CHECK(
        inside, "openreg IPC: the storage (", nbytes, " bytes at ", storage_offset,
        ") does not lie inside the shared range.");
    OPENREG_CHECK(status);
  }
  const c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(handle.device));
  auto* opened = new Opened{allocation, counter};
  c10::DataPtr data(static_cast<char*>(allocation) + storage_offset, opened, &close_opened, device);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(nbytes), std::move(data), /*allocator=*/nullptr,
      /*resizable=*/false));
}

void release_send(int counter_file) {
  std::atomic<int64_t>* counter = map_counter(counter_file);
  counter->fetch_sub(1, std::memory_order_acq_rel);
  munmap(counter, kCounterBytes);
}

} // namespace openreg::ipc
