// The PrivateUse1 device allocator. It subclasses c10::DeviceAllocator because
// torch.accelerator's memory APIs (memory_allocated, memory_stats, ...) reach the
// backend only through that interface (c10/core/CachingDeviceAllocator.h).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

namespace openreg {

c10::DeviceAllocator* device_allocator();

// device_allocator()->allocate(nbytes) on openreg:`device` (a valid index)
// instead of the current device, without switching devices.
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);

// Grows or shrinks a device storage to `new_nbytes`, keeping its contents (as
// resize_bytes_cpu does for CPU, but moving bytes with the runtime's memcpy).
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes);

// torch.openreg.set_per_process_memory_fraction: the caching allocator of
// openreg:`device` reserves at most `fraction` (0 to 1) of the device's
// capacity, as CUDA's does; a segment beyond it first frees the cache and
// retries, then raises torch.OutOfMemoryError naming the limit.
void set_memory_fraction(c10::DeviceIndex device, double fraction);
double get_memory_fraction(c10::DeviceIndex device);

} // namespace openreg
