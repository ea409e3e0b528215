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

// This thread's recycled operand aliases (see operand_alias), fetched once
// per call by the callers.
struct HostAliasPool;
HostAliasPool& host_alias_pool();

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

// A nested tensor of the strided layout (NestedTensorImpl) with `t`'s nested
// sizes, strides and storage offsets over `storage`, with the dispatch keys
// torch gives a nested tensor over a buffer of `storage`'s device: a
// NestedTensorCPU host alias of the nested openreg tensor `t` over
// host_alias_storage(t.storage()), or a nested openreg tensor over device
// memory. The metadata tensors are shared (torch never writes them).
at::Tensor nested_tensor_on(
    const c10::Storage& storage,
    const at::Tensor& t,
    at::Tensor nested_sizes,
    at::Tensor nested_strides,
    at::Tensor storage_offsets);
at::Tensor nested_tensor_on(const c10::Storage& storage, const at::Tensor& t);

// Whether `storage`'s bytes are device memory handed out as CPU memory
// (allocate_host_visible), not yet taken by a device storage.
bool is_host_visible(const c10::Storage& storage);

// Host aliases of HostCall's operands. Unlike host_alias's, an operand
// alias's storage holds no reference to the device memory: the operand keeps
// that alive during the call. A recycled operand alias keeps its own storage,
// so making one changes no reference count.
// - operand_alias: an alias of `t` with a storage of its own (another operand
//   on the same device storage shares that storage: host_alias(t, storage));
// - end_operand_alias, once the CPU kernel is done (the ones sharing a
//   storage first): recycles the alias if nothing else holds it or its storage;
//   otherwise its storage takes a reference to `device_storage`, so whatever
//   kept it stays valid.
at::Tensor operand_alias(const at::TensorBase& t, HostAliasPool& pool);
void end_operand_alias(at::Tensor&& alias, c10::StorageImpl* device_storage, HostAliasPool& pool);

// An operand alias of `t` for the length of a kernel call on it (`t` must
// outlive it), ended (recycled) afterwards.
class ScopedHostAlias {
 public:
  explicit ScopedHostAlias(const at::TensorBase& t)
      : pool_(host_alias_pool()), device_storage_(t.storage().unsafeGetStorageImpl()), alias_(operand_alias(t, pool_)) {}
  ScopedHostAlias(const ScopedHostAlias&) = delete;
  ScopedHostAlias& operator=(const ScopedHostAlias&) = delete;
  ~ScopedHostAlias() {
    end_operand_alias(std::move(alias_), device_storage_, pool_);
  }
  const at::Tensor& get() const {
    return alias_;
  }
  at::Tensor& get() {
    return alias_;
  }

 private:
  HostAliasPool& pool_;
  c10::StorageImpl* device_storage_;
  at::Tensor alias_;
};

} // namespace openreg
