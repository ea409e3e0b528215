// Shared state of the runtime's translation units; not part of the driver API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "OpenRegRuntime.h"

namespace openreg::detail {

// Fixed once orInit succeeded.
struct Config {
  int device_count = 0;
  size_t device_memory = 0;   // bytes per device
  uintptr_t device_base = 0;  // PROT_NONE addresses handed out by orMalloc
  uintptr_t kernel_base = 0;  // the same bytes, readable and writable
  bool launch_blocking = false; // OPENREG_LAUNCH_BLOCKING=1
  bool queue_all_kernels = false; // OPENREG_QUEUE_ALL_KERNELS=1
  bool discrete_memory = false; // OPENREG_DISCRETE_MEMORY=1
};

// Null before a successful orInit.
const Config* config();

// Memory.cpp: reserves both views of every device's memory.
orError map_device_memory(Config& config, std::string* message);
// Memory.cpp: the live allocation containing `addr` (a device address), for
// the fault handler. With `try_only`, gives up instead of waiting for a lock.
bool find_allocation(uintptr_t addr, bool try_only, int* device, uintptr_t* base, size_t* size);

// Memory.cpp: the device whose region holds `addr`, or -1 (host memory).
int device_of_address(const void* addr);

// Memory.cpp: the argument checks of orMemcpy / orMemcpyAsync. Success when
// count is 0 (nothing to check); InvalidValue for a null pointer;
// InvalidPointer unless device sides lie inside one live allocation and host
// sides are not device addresses.
orError check_copy(const void* dst, const void* src, size_t count, orMemcpyKind kind);

// Device.cpp: InvalidDevice unless 0 <= device < device count (initialising
// the runtime if needed).
orError check_device(int device);

// Fault.cpp: reports host dereferences of device addresses.
void install_fault_handler();

// Stream.cpp: waits for every stream of `device`; LaunchFailure if a kernel
// on one of them failed.
orError synchronize_device_streams(int device);
// Stream.cpp: waits for every stream of `device`, leaving failures and the
// release of kernel arguments to the next synchronising call.
void wait_device_streams(int device);

// Activity.cpp: the callback copies report to, or nullptr (one relaxed load).
orActivityCallback activity_callback();
// Activity.cpp: a record of a copy about to be issued, with the issuing
// thread's correlation id and the device side's device; the copy fills in
// the times.
orActivityMemcpy memcpy_record(const void* dst, const void* src, size_t count, orMemcpyKind kind, orStream_t stream);

// Memory.cpp: the copy engine: moves `count` bytes between kernel (host)
// addresses; the ranges may overlap.
void copy_bytes(void* to, const void* from, size_t count);

} // namespace openreg::detail
