// Host aliases: CPU tensors that view the bytes of openreg tensors.
//
// The simulated device's memory is host memory, so a "device kernel" is a CPU
// kernel run on a CPU tensor that aliases device memory at the address the
// runtime gives kernels (orKernelAddress); the device address itself is not
// accessible from host code. Copies, .item() and the
// CPU fallback all go through these two functions; they are the single place
// that decides how host code may reach device memory.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <optional>

namespace openreg {

// A resizable CPU storage over the same bytes as `device_storage`; it keeps the
// device memory alive for as long as it lives. If a CPU kernel resizes it, it
// moves to fresh memory of the same openreg device (see
// take_grown_device_memory) and the original device memory is left untouched.
c10::Storage host_alias_storage(const c10::Storage& device_storage);

// `nbytes` of fresh memory of openreg device `index`, as a CPU DataPtr at the
// kernel address; take_grown_device_memory gives the device memory back.
c10::DataPtr allocate_host_visible(c10::DeviceIndex index, size_t nbytes);
// Frees memory from allocate_host_visible by its data pointer; false if
// `data` is not such memory.
bool release_host_visible(void* data);

// If `host_storage`'s bytes came from allocate_host_visible (a CPU kernel
// resized an alias from host_alias_storage, or allocated while a HostCall
// redirected CPU allocations), that device memory, for a device storage to
// adopt; the host storage keeps viewing those bytes but no longer owns them.
std::optional<c10::DataPtr> take_grown_device_memory(const c10::Storage& host_storage);

// A CPU tensor with `t`'s sizes, strides, offset, dtype and conj/neg bits over
// `host_storage` (from host_alias_storage(t.storage())).
at::Tensor host_alias(const at::TensorBase& t, const c10::Storage& host_storage);

inline at::Tensor host_alias(const at::Tensor& t) {
  return host_alias(t, host_alias_storage(t.storage()));
}

// Hands a host alias (from host_alias) and then its storage (from
// host_alias_storage) back once the caller is done with them. Objects nothing
// else references are kept, per thread, for the next host_alias /
// host_alias_storage, so a kernel call on small tensors does not allocate and
// construct a CPU TensorImpl and StorageImpl per operand. The device memory
// is released at once either way.
void recycle_host_alias(at::Tensor&& alias);
void recycle_host_alias_storage(c10::Storage&& host_storage);

// A host alias of `t` for the length of a kernel call, recycled afterwards.
class ScopedHostAlias {
 public:
  explicit ScopedHostAlias(const at::TensorBase& t) : storage_(host_alias_storage(t.storage())), alias_(host_alias(t, storage_)) {}
  ScopedHostAlias(const ScopedHostAlias&) = delete;
  ScopedHostAlias& operator=(const ScopedHostAlias&) = delete;
  ~ScopedHostAlias() {
    recycle_host_alias(std::move(alias_));
    recycle_host_alias_storage(std::move(storage_));
  }
  const at::Tensor& get() const {
    return alias_;
  }

 private:
  c10::Storage storage_;
  at::Tensor alias_;
};

} // namespace openreg
