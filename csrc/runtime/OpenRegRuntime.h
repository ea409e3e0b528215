// The simulated openreg driver API.
//
// This layer plays the role the CUDA driver/runtime plays for torch.cuda: device
// enumeration, the current device of a thread, device memory and copies. It knows
// nothing of tensors, ATen or Python; everything above it (allocator, guard,
// hooks, kernels) talks to the "hardware" only through these functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace openreg {

enum class orError {
  Success = 0,
  InvalidDevice,       // device index outside [0, device count)
  InvalidValue,        // null pointer where one is required, bad kind, ...
  MemoryAllocation,    // the host could not provide the memory
  InvalidPointer,      // the pointer is not (inside) a live openreg allocation
  InvalidConfiguration // OPENREG_DEVICE_COUNT is malformed
};

enum class orMemcpyKind { HostToHost, HostToDevice, DeviceToHost, DeviceToDevice };

struct orPointerAttributes {
  bool is_device = false;      // true when the pointer lies inside a device allocation
  bool is_pinned_host = false; // true when it lies inside page-locked host memory
  int device = -1;             // owning device, when is_device
  void* base = nullptr;   // start of the owning allocation
  size_t size = 0;        // size of the owning allocation in bytes
};

// Largest device count OPENREG_DEVICE_COUNT may ask for.
constexpr int kMaxDevices = 16;
constexpr int kDefaultDeviceCount = 2;

const char* orGetErrorString(orError error);

// Reads OPENREG_DEVICE_COUNT once. On InvalidConfiguration, `message` (if given)
// receives a sentence saying what was wrong and how to fix it.
orError orInit(const char** message = nullptr);
orError orGetDeviceCount(int* count);
orError orGetDevice(int* device);
orError orSetDevice(int device);

// Allocates `size` bytes on the current device. A zero-byte request yields nullptr.
orError orMalloc(void** ptr, size_t size);
orError orFree(void* ptr);
// Page-locked ("pinned") host memory, the source and target of asynchronous copies.
orError orMallocHost(void** ptr, size_t size);
orError orFreeHost(void* ptr);
orError orMemcpy(void* dst, const void* src, size_t count, orMemcpyKind kind);
orError orPointerGetAttributes(orPointerAttributes* attributes, const void* ptr);
// Waits for all work queued on `device`. Work is synchronous in this simulation,
// so this only validates the index; it exists so the layers above are written
// as they would be for asynchronous hardware.
orError orDeviceSynchronize(int device);

} // namespace openreg
