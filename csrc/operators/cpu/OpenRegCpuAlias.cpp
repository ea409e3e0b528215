#include "operators/cpu/OpenRegCpuAlias.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/NestedTensorImpl.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/TensorBase.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegSpinLock.h"
#include "device/OpenRegException.h"
#include "device/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {
namespace {

// An alias holds a reference to the device StorageImpl itself (no separate
// keep-alive object to allocate per alias).
void release_device_storage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// The registry of CPU-visible device memory (allocate_cpu_visible), by kernel
// address. The CPU DataPtrs have their data as context, as
// Allocator::raw_allocate requires (mkldnn and others allocate raw memory
// through the CPU allocator while a CpuKernelCall redirects it). Entries live from
// a kernel's allocation to its result's adoption (or the kernel freeing a
// temporary), so there are few: a flat list, searched from its newest end.
struct CpuVisibleRegistry {
  SpinLock lock;
  std::vector<std::pair<void*, c10::DataPtr>> memory;
};

CpuVisibleRegistry& cpu_visible() {
  static auto* registry = new CpuVisibleRegistry(); // leaked: deleters may run at exit
  return *registry;
}

std::optional<c10::DataPtr> take_cpu_visible(void* data) {
  CpuVisibleRegistry& r = cpu_visible();
  const std::lock_guard<SpinLock> lock(r.lock);
  for (size_t i = r.memory.size(); i-- > 0;) {
    if (r.memory[i].first == data) {
      c10::DataPtr device = std::move(r.memory[i].second);
      if (i + 1 != r.memory.size()) {
        r.memory[i] = std::move(r.memory.back());
      }
      r.memory.pop_back();
      return device;
    }
  }
  return std::nullopt;
}

void keep_taken(void* /*data*/) {}

void delete_cpu_visible(void* data);

// The allocator of an alias storage. A CPU kernel that resizes an out= alias
// (at::native::resize_output -> resize_bytes_cpu) allocates through it; the
// new bytes are device memory of the alias's device, wrapped as a CPU DataPtr,
// so the fallback can hand them to the device storage instead of copying
// (take_grown_device_memory). allocate_cpu_visible does the allocation.
class GrowthAllocator final : public c10::Allocator {
 public:
  void set_device(c10::DeviceIndex index) {
    index_ = index;
  }

  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_cpu_visible(index_, nbytes);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  c10::DeviceIndex index_ = 0;
};

GrowthAllocator* growth_allocator(c10::DeviceIndex index) {
  static std::array<GrowthAllocator, kMaxDevices> allocators = [] {
    std::array<GrowthAllocator, kMaxDevices> a;
    for (int i = 0; i < kMaxDevices; ++i) {
      a[i].set_device(static_cast<c10::DeviceIndex>(i));
    }
    return a;
  }();
  return &allocators.at(static_cast<size_t>(index));
}

// The device whose memory this thread's CPU allocations come from
// (redirect_cpu_allocations), or -1.
thread_local c10::DeviceIndex redirect_device = -1;

// This thread's planned allocations (PlannedCpuAllocations), or nullptr.
thread_local PlannedCpuAllocations* planned_allocations = nullptr;

// The deleter of a planned block: its device storage owns it.
void planned_block(void* /*data*/) {}

// torch's CPU allocator with one change: while this thread's allocations are
// redirected (a CpuKernelCall runs its CPU kernel), they are CPU-visible
// memory of that openreg device, so the kernel's results are device memory
// and CpuKernelCall::result adopts them instead of copying. Elsewhere, and on
// the threads of a parallel region, it is the allocator it replaced.
class RedirectingCPUAllocator final : public c10::Allocator {
 public:
  explicit RedirectingCPUAllocator(c10::Allocator* cpu) : cpu_(cpu) {
    cpu_raw_deleter() = cpu->raw_deleter();
  }

  c10::DataPtr allocate(size_t nbytes) override {
    if (redirect_device >= 0) {
      return allocate_cpu_visible(redirect_device, nbytes);
    }
    if (planned_allocations != nullptr) {
      if (void* data = planned_allocations->take(nbytes)) {
        return c10::DataPtr(data, data, &planned_block, c10::Device(c10::DeviceType::CPU));
      }
    }
    return cpu_->allocate(nbytes);
  }

  // Allocator::raw_deallocate frees raw_allocate()'s pointers through this
  // deleter, whichever allocation they came from.
  c10::DeleterFnPtr raw_deleter() const override {
    return cpu_raw_deleter() != nullptr ? &raw_delete : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    cpu_->copy_data(dest, src, count);
  }

 private:
  static c10::DeleterFnPtr& cpu_raw_deleter() {
    static c10::DeleterFnPtr deleter = nullptr;
    return deleter;
  }

  static void raw_delete(void* data) {
    if (planned_allocations != nullptr && planned_allocations->planned(data)) {
      return;
    }
    if (!release_cpu_visible(data)) {
      cpu_raw_deleter()(data);
    }
  }

  c10::Allocator* cpu_;
};

constexpr size_t kRecycled = 8;

} // namespace

namespace detail {

// Operand aliases that nothing references any more, for reuse on this
// thread: each keeps its own storage (with no data) between calls.
struct CpuAliasPool {
  c10::SmallVector<c10::intrusive_ptr<c10::TensorImpl>, kRecycled> operands;
};

CpuAliasPool& cpu_alias_pool() {
  thread_local CpuAliasPool pool;
  return pool;
}

} // namespace detail

void install_cpu_allocator_redirect() {
  // Above the priority c10 registers its own CPU allocator with. A function
  // static: installed once, whoever calls.
  static const bool installed = [] {
    static RedirectingCPUAllocator allocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    return true;
  }();
  (void)installed;
}

PlannedCpuAllocations::PlannedCpuAllocations(c10::SmallVector<Block, 4> blocks)
    : blocks_(std::move(blocks)), previous_(std::exchange(planned_allocations, this)) {}

PlannedCpuAllocations::~PlannedCpuAllocations() {
  planned_allocations = previous_;
}

void* PlannedCpuAllocations::take(size_t nbytes) {
  for (Block& b : blocks_) {
    if (!b.taken && b.nbytes == nbytes && nbytes > 0) {
      b.taken = true;
      return b.data;
    }
  }
  return nullptr;
}

bool PlannedCpuAllocations::planned(const void* data) const {
  return std::any_of(blocks_.begin(), blocks_.end(), [&](const Block& b) { return b.data == data; });
}

bool PlannedCpuAllocations::inside(const void* data) const {
  const auto* p = static_cast<const char*>(data);
  return std::any_of(blocks_.begin(), blocks_.end(), [&](const Block& b) {
    const auto* begin = static_cast<const char*>(b.data);
    return p >= begin && p < begin + b.nbytes;
  });
}

c10::DeviceIndex redirect_cpu_allocations(c10::DeviceIndex index) {
  return std::exchange(redirect_device, index);
}

namespace {
void delete_cpu_visible(void* data) {
  release_cpu_visible(data);
}
} // namespace

bool release_cpu_visible(void* data) {
  // The device memory is freed when the taken DataPtr goes, outside the lock.
  return take_cpu_visible(data).has_value();
}

c10::DataPtr allocate_cpu_visible(c10::DeviceIndex index, size_t nbytes) {
  c10::DataPtr device = allocate_on(index, nbytes);
  if (device.get() == nullptr) {
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
  }
  // The host writes this block at once. It came from the current stream's
  // pool, where another thread may have freed it after this thread joined
  // the stream while a kernel it queued still uses it: wait for that work.
  // While the stream is captured into a graph (a call learning its results'
  // shapes, OpenRegBoxedCpuKernel.cpp), the block is the graph's, and none of
  // the graph's work has run.
  if (!current_stream_capturing(index)) {
    wait_current_stream(index);
  }
  void* data = orKernelAddress(device.get());
  {
    CpuVisibleRegistry& r = cpu_visible();
    const std::lock_guard<SpinLock> lock(r.lock);
    r.memory.emplace_back(data, std::move(device));
  }
  return c10::DataPtr(data, data, &delete_cpu_visible, c10::Device(c10::DeviceType::CPU));
}

c10::Storage cpu_alias_storage(const c10::Storage& device_storage) {
  c10::StorageImpl* keep_alive = device_storage.unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(keep_alive);
  void* data = orKernelAddress(device_storage.unsafeGetStorageImpl()->data_ptr().get());
  c10::DataPtr ptr(data, keep_alive, &release_device_storage, c10::Device(c10::DeviceType::CPU));
  const c10::DeviceIndex index = device_storage.device().has_index() ? device_storage.device().index() : 0;
  return c10::Storage(
      c10::Storage::use_byte_size_t(), device_storage.nbytes(), std::move(ptr),
      growth_allocator(index), /*resizable=*/true);
}

c10::Storage host_copy(const c10::Storage& device_storage) {
  const size_t nbytes = device_storage.nbytes();
  c10::Storage host(c10::Storage::use_byte_size_t(), nbytes, c10::GetCPUAllocator(), /*resizable=*/true);
  if (nbytes > 0) {
    OPENREG_CHECK(orMemcpy(host.mutable_data(), device_storage.data(), nbytes, orMemcpyKind::DeviceToHost));
  }
  return host;
}

namespace {

// The deleter of an operand alias's DataPtr, which has no context and so owns
// nothing: it only marks the storage as still over the operand's memory.
void borrowed_device_memory(void* /*ctx*/) {}

c10::DataPtr borrowed(const c10::StorageImpl& device_storage) {
  void* data = orKernelAddress(device_storage.data_ptr().get());
  return c10::DataPtr(data, nullptr, &borrowed_device_memory, c10::Device(c10::DeviceType::CPU));
}

// ArrayRef::equals, without the memcmp call it makes for a few elements.
bool same(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return false;
    }
  }
  return true;
}

// `t`'s sizes, strides, offset and conj/neg bits, set only where they differ
// (a recycled alias usually has them already).
void set_geometry(c10::TensorImpl& alias, const at::TensorBase& t) {
  if (!same(alias.sizes(), t.sizes()) || !same(alias.strides(), t.strides())) {
    alias.set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  } else if (alias.storage_offset() != t.storage_offset()) {
    alias.set_storage_offset(t.storage_offset());
  }
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
}

} // namespace

namespace detail {

at::Tensor operand_alias(const at::TensorBase& t, CpuAliasPool& pool) {
  const c10::StorageImpl& device = *t.storage().unsafeGetStorageImpl();
  const c10::DeviceIndex index = t.device().has_index() ? t.device().index() : 0;
  // A recycled alias of the same dtype keeps its own storage: setting it up
  // changes no reference count (an atomic operation each).
  for (size_t i = pool.operands.size(); i-- > 0;) {
    if (pool.operands[i]->dtype() == t.dtype()) {
      c10::intrusive_ptr<c10::TensorImpl> impl = std::move(pool.operands[i]);
      pool.operands.erase(pool.operands.begin() + static_cast<std::ptrdiff_t>(i));
      // It still views the memory of its last operand, often this one: only
      // what differs is written.
      c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
      if (storage->data_ptr().get() != orKernelAddress(device.data_ptr().get())) {
        storage->set_data_ptr_noswap(borrowed(device));
      }
      if (storage->nbytes() != device.nbytes()) {
        storage->set_nbytes(device.nbytes());
      }
      c10::Allocator* growth = growth_allocator(index);
      if (storage->allocator() != growth) {
        storage->set_allocator(growth);
      }
      set_geometry(*impl, t);
      return at::Tensor(std::move(impl));
    }
  }
  return cpu_alias(
      t, c10::Storage(c10::Storage::use_byte_size_t(), device.nbytes(), borrowed(device), growth_allocator(index),
                      /*resizable=*/true));
}

void end_operand_alias(at::Tensor&& alias, c10::StorageImpl* device_storage, CpuAliasPool& pool) {
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  const bool over_operand = storage->data_ptr().get_deleter() == &borrowed_device_memory;
  const bool kept = alias.use_count() != 1 || alias.weak_use_count() != 1 ||
      c10::raw::intrusive_ptr::use_count(storage) != 1 || c10::raw::weak_intrusive_ptr::use_count(storage) != 1;
  if (!over_operand) {
    // The CPU kernel resized it: its storage owns other memory now
    // (take_grown_device_memory), and it is left to be freed.
    alias.reset();
    return;
  }
  if (kept) {
    // The CPU kernel kept the alias or its storage: from now on the storage
    // holds the device memory itself.
    c10::raw::intrusive_ptr::incref(device_storage);
    void* data = storage->data_ptr().get();
    storage->set_data_ptr_noswap(
        c10::DataPtr(data, device_storage, &release_device_storage, c10::Device(c10::DeviceType::CPU)));
    alias.reset();
    return;
  }
  // An alias a kernel froze (detach-like metadata locks), marked as a wrapped
  // number, gave autograd metadata or handed to Python (a kernel written in
  // Python) is left to be freed.
  if (pool.operands.size() == kRecycled || !impl->allow_tensor_metadata_change() || impl->is_wrapped_number() ||
      impl->autograd_meta() != nullptr || impl->pyobj_slot()->load_pyobj() != nullptr) {
    alias.reset();
    return;
  }
  // Its storage keeps viewing the operand's memory (without owning it), so
  // the next call on the same operand finds it set up; nothing reads a pooled
  // alias.
  pool.operands.push_back(alias.unsafeReleaseIntrusivePtr());
}

} // namespace detail

std::optional<c10::DataPtr> take_grown_device_memory(const c10::Storage& cpu_storage) {
  c10::DataPtr& ptr = cpu_storage.unsafeGetStorageImpl()->_mutable_data_ptr_no_checks();
  // The CPU storage keeps pointing at the bytes; the device storage owns them now.
  if (!ptr.compare_exchange_deleter(&delete_cpu_visible, &keep_taken)) {
    return std::nullopt;
  }
  return take_cpu_visible(ptr.get());
}

at::Tensor cpu_alias(const at::TensorBase& t, const c10::Storage& cpu_storage) {
  at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  set_geometry(*alias.unsafeGetTensorImpl(), t);
  return alias;
}

at::Tensor nested_tensor_on(
    const c10::Storage& storage,
    const at::Tensor& t,
    at::Tensor nested_sizes,
    at::Tensor nested_strides,
    at::Tensor storage_offsets) {
  // A 1-d buffer over the whole storage, as NestedTensorImpl::get_buffer
  // sees it; the NestedTensorImpl constructor derives the nested tensor's
  // dispatch keys from the buffer's (NestedTensorCPU or NestedTensorPrivateUse1,
  // with AutogradNestedTensor), as for the nested tensors torch makes itself.
  const c10::Device device = storage.device();
  at::Tensor buffer = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(device.is_cpu() ? c10::DispatchKey::CPU : c10::DispatchKey::PrivateUse1),
      t.dtype());
  buffer.unsafeGetTensorImpl()->set_sizes_contiguous(
      {static_cast<int64_t>(storage.nbytes() / t.dtype().itemsize())});
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      buffer, std::move(nested_sizes), std::move(nested_strides), std::move(storage_offsets));
}

at::Tensor nested_tensor_on(const c10::Storage& storage, const at::Tensor& t) {
  const at::native::NestedTensorImpl* nt = at::native::get_nested_tensor_impl(t);
  return nested_tensor_on(storage, t, nt->get_nested_sizes(), nt->get_nested_strides(), nt->get_storage_offsets());
}

bool is_cpu_visible(const c10::Storage& storage) {
  return storage.unsafeGetStorageImpl()->data_ptr().get_deleter() == &delete_cpu_visible;
}

bool is_sparse_layout(const at::TensorBase& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return impl->is_sparse() || impl->is_sparse_compressed();
}

namespace {

at::SparseTensorImpl* coo_impl(const at::Tensor& t) {
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}

at::SparseCsrTensorImpl* compressed_impl(const at::Tensor& t) {
  return static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

} // namespace

c10::SmallVector<at::Tensor, 3> sparse_members(const at::Tensor& t) {
  if (t.layout() == c10::kSparse) {
    const at::SparseTensorImpl* impl = coo_impl(t);
    return {impl->indices(), impl->values()};
  }
  const at::SparseCsrTensorImpl* impl = compressed_impl(t);
  return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
}

void set_sparse_members(const at::Tensor& t, const at::Tensor& like, c10::ArrayRef<at::Tensor> members) {
  if (like.layout() == c10::kSparse) {
    const at::SparseTensorImpl* from = coo_impl(like);
    at::SparseTensorImpl* impl = coo_impl(t);
    // raw_resize_, not resize_: resize_ refuses to shrink the dimensions of a
    // tensor with elements, which the members set next replace anyway.
    impl->raw_resize_(from->sparse_dim(), from->dense_dim(), like.sizes());
    impl->set_indices_and_values_unsafe(members[0], members[1]);
    impl->set_coalesced(from->coalesced());
    return;
  }
  compressed_impl(t)->set_member_tensors(members[0], members[1], members[2], like.sizes());
}

at::Tensor sparse_tensor_on(c10::Device device, const at::Tensor& like, c10::ArrayRef<at::Tensor> members) {
  const bool cpu = device.is_cpu();
  // SparseTensorImpl takes its device from the empty members it makes, on
  // the current device.
  const c10::OptionalDeviceGuard guard(cpu ? std::nullopt : std::optional<c10::Device>(device));
  at::Tensor out;
  if (like.layout() == c10::kSparse) {
    out = at::detail::make_tensor<at::SparseTensorImpl>(
        c10::DispatchKeySet(cpu ? c10::DispatchKey::SparseCPU : c10::DispatchKey::SparsePrivateUse1), like.dtype());
  } else {
    out = at::detail::make_tensor<at::SparseCsrTensorImpl>(
        c10::DispatchKeySet(cpu ? c10::DispatchKey::SparseCsrCPU : c10::DispatchKey::SparseCsrPrivateUse1), device,
        like.layout(), like.dtype());
  }
  set_sparse_members(out, like, members);
  return out;
}

} // namespace openreg
