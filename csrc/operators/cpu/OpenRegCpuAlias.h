// CPU aliases, and device memory lent to CPU code.
//
// The simulated device's memory is the process's memory, so a "device kernel"
// is a CPU kernel run on a CPU alias: a CPU tensor over the bytes of an openreg
// tensor at the address the runtime gives kernels (orKernelAddress); the
// device address itself is not accessible from CPU code. Copies, .item(), the
// CPU kernels run on device memory and the CPU fallback all reach device memory
// through the functions and classes here; they are the single place that
// decides how CPU code may do so.
//
// The other direction: CPU code that allocates while it works on CPU aliases
// (a kernel resizing an out= alias, a CPU kernel's fresh result) gets
// CPU-visible device memory, device memory handed out as a CPU DataPtr, so the
// result is already on the device and no copy is needed.
#pragma once

#include <cstddef>
#include <list>
#include <optional>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/util/SmallVector.h>

namespace openreg {

// --- CPU-visible device memory ---

// `nbytes` of fresh memory of openreg device `index`, as a CPU DataPtr at the
// kernel address; take_grown_device_memory gives the device memory back.
c10::DataPtr allocate_cpu_visible(c10::DeviceIndex index, size_t nbytes);
// Frees memory from allocate_cpu_visible by its data pointer; false if
// `data` is not such memory.
bool release_cpu_visible(void* data);
// Whether `storage`'s bytes are CPU-visible device memory not yet taken by a
// device storage.
bool is_cpu_visible(const c10::Storage& storage);

// If `cpu_storage`'s bytes are CPU-visible device memory (a CPU kernel resized
// an alias from cpu_alias_storage, or allocated while its allocations were
// redirected), that device memory, for a device storage to adopt; the CPU
// storage keeps viewing those bytes but no longer owns them.
std::optional<c10::DataPtr> take_grown_device_memory(const c10::Storage& cpu_storage);

// Replaces torch's CPU allocator by one that, while this thread's allocations
// are redirected (redirect_cpu_allocations), hands out CPU-visible memory of
// an openreg device; elsewhere it is the allocator it replaced. Called once by
// the extension's module initialisation (csrc/python/Module.cpp), before any
// openreg operator runs; later calls do nothing.
void install_cpu_allocator_redirect();

// From now on this thread's CPU allocations come from openreg device `index`
// (-1: from the CPU again); returns the previous setting, to restore. A
// CpuKernelCall redirects them while its CPU kernel runs, so that kernel's
// fresh results are device memory. Threads of a parallel region the kernel
// starts are not redirected.
c10::DeviceIndex redirect_cpu_allocations(c10::DeviceIndex index);

// --- Planned results of a queued CPU kernel ---

// While one lives, this thread's CPU allocations of exactly a block's size
// get that block (the first not yet handed out), as a DataPtr that owns
// nothing: a queued CPU kernel (OpenRegBoxedCpuKernel.h) writes its fresh
// results straight into the device memory its launch gave them, at kernel
// addresses. Other allocations are the CPU allocator's.
class PlannedCpuAllocations {
 public:
  struct Block {
    void* data = nullptr;
    size_t nbytes = 0;
    bool taken = false;
  };
  explicit PlannedCpuAllocations(c10::SmallVector<Block, 4> blocks);
  PlannedCpuAllocations(const PlannedCpuAllocations&) = delete;
  PlannedCpuAllocations& operator=(const PlannedCpuAllocations&) = delete;
  ~PlannedCpuAllocations();

  // For the allocator: a block of `nbytes` not yet handed out, or nullptr.
  void* take(size_t nbytes);
  // Whether `data` is the start of one of the blocks.
  bool planned(const void* data) const;
  // Whether `data` lies inside one of the blocks.
  bool inside(const void* data) const;

 private:
  c10::SmallVector<Block, 4> blocks_;
  PlannedCpuAllocations* previous_;
};

// --- CPU aliases ---

// A resizable CPU storage over the same bytes as `device_storage`; it keeps the
// device memory alive for as long as it lives. If a CPU kernel resizes it, it
// moves to fresh CPU-visible memory of the same openreg device (see
// take_grown_device_memory) and the original device memory is left untouched.
c10::Storage cpu_alias_storage(const c10::Storage& device_storage);

// A copy of `device_storage`'s bytes in fresh, resizable host memory, for
// CPU code on a device whose memory it cannot address (discrete_memory(),
// OpenRegLaunch.h): the staging copy torch's cpu_fallback makes per tensor,
// made per storage so that operands sharing memory share it on the host too.
c10::Storage host_copy(const c10::Storage& device_storage);

// A CPU tensor with `t`'s sizes, strides, offset, dtype and conj/neg bits over
// `cpu_storage` (from cpu_alias_storage(t.storage()), or another alias's).
at::Tensor cpu_alias(const at::TensorBase& t, const c10::Storage& cpu_storage);

inline at::Tensor cpu_alias(const at::Tensor& t) {
  return cpu_alias(t, cpu_alias_storage(t.storage()));
}

// A nested tensor of the strided layout (NestedTensorImpl) with `t`'s nested
// sizes, strides and storage offsets over `storage`, with the dispatch keys
// torch gives a nested tensor over a buffer of `storage`'s device: a
// NestedTensorCPU alias of the nested openreg tensor `t` over
// cpu_alias_storage(t.storage()), or a nested openreg tensor over device
// memory. The metadata tensors are shared (torch never writes them).
at::Tensor nested_tensor_on(
    const c10::Storage& storage,
    const at::Tensor& t,
    at::Tensor nested_sizes,
    at::Tensor nested_strides,
    at::Tensor storage_offsets);
at::Tensor nested_tensor_on(const c10::Storage& storage, const at::Tensor& t);

// Sparse layouts (COO, CSR, CSC, BSR, BSC): a sparse tensor has no storage
// of its own, only member tensors (COO: indices, values; the compressed
// layouts: compressed indices, plain indices, values), read from its
// TensorImpl, not through the dispatcher (sparse_dim() and is_coalesced()
// are operators, which on openreg reach the sparse fallback).
bool is_sparse_layout(const at::TensorBase& t);
c10::SmallVector<at::Tensor, 3> sparse_members(const at::Tensor& t);

// A sparse tensor with `like`'s layout, sizes, sparse and dense dimensions
// and coalesced flag over `members` (as sparse_members orders them), with
// the dispatch keys torch gives a sparse tensor of `device`'s type: SparseCPU
// / SparseCsrCPU for the CPU alias of a sparse openreg tensor (its members
// CPU aliases), SparsePrivateUse1 / SparseCsrPrivateUse1 for a sparse openreg
// tensor (its members openreg tensors), as SparseTensor.cpp's new_sparse and
// SparseCsrTensor.cpp's new_compressed_tensor make them for CPU and CUDA.
at::Tensor sparse_tensor_on(c10::Device device, const at::Tensor& like, c10::ArrayRef<at::Tensor> members);

// Gives the sparse tensor `t` the layout, sizes and flags of `like` and the
// member tensors `members` (a written sparse operand, after the CPU kernel
// replaced its alias's members).
void set_sparse_members(const at::Tensor& t, const at::Tensor& like, c10::ArrayRef<at::Tensor> members);

namespace detail {

// This thread's recycled operand aliases, fetched once per call.
struct CpuAliasPool;
CpuAliasPool& cpu_alias_pool();

// CpuAliases' steps (use that class). Unlike cpu_alias's, an operand alias's
// storage holds no reference to the device memory: the operand keeps that
// alive during the call. A recycled operand alias keeps its own storage, so
// making one changes no reference count.
// - operand_alias: an alias of `t` with a storage of its own;
// - end_operand_alias, once the CPU kernel is done: recycles the alias if
//   nothing else holds it or its storage; otherwise its storage takes a
//   reference to `device_storage`, so whatever kept it stays valid.
at::Tensor operand_alias(const at::TensorBase& t, CpuAliasPool& pool);
void end_operand_alias(at::Tensor&& alias, c10::StorageImpl* device_storage, CpuAliasPool& pool);

} // namespace detail

struct NoExtra {};

// The CPU aliases of the openreg operands of one call of CPU code, ended when
// the call is over. The first alias of a device storage owns a CPU storage (a
// recycled operand alias); later aliases of the same device storage share it,
// so operands that share memory share it for the CPU code too (it sees the
// overlap a CPU call would, and a CPU result can be traced back to its
// operand), and a tensor given twice (an in-place call's self and out) gets
// one alias. They end in reverse order, the aliases sharing a storage before
// the one that made it, which decides what becomes of the storage
// (end_operand_alias). A nested operand's alias owns a reference to the device
// storage instead (cpu_alias_storage): the pool keeps dense aliases only.
//
// Entries never move (kInline in place, the rest in a list), so references to
// aliases stay valid until the end; `Extra` is what a user keeps per operand.
// Nothing is allocated for the first kInline operands.
template <size_t kInline, class Extra = NoExtra>
class CpuAliases {
 public:
  struct Entry {
    at::Tensor alias;
    const c10::TensorImpl* device_tensor = nullptr;
    c10::StorageImpl* device_storage = nullptr;
    // The alias made; a user may replace `alias` (an impl() that assigns to
    // its output), and then only drops it.
    const c10::TensorImpl* made = nullptr;
    bool first_on_storage = false;
    bool pooled = false; // from operand_alias
    Extra extra{};
  };

  // `staged`: each alias is over a host_copy of its device storage instead
  // of the device memory itself.
  explicit CpuAliases(bool staged = false) : staged_(staged) {}
  bool staged() const {
    return staged_;
  }
  CpuAliases(const CpuAliases&) = delete;
  CpuAliases& operator=(const CpuAliases&) = delete;
  ~CpuAliases() {
    end();
  }

  // The entry of the openreg tensor `t`: the one made for it earlier, or a new
  // one (then `.second`).
  std::pair<Entry*, bool> get(const at::TensorBase& t) {
    c10::StorageImpl* device_storage = t.storage().unsafeGetStorageImpl();
    Entry* known = nullptr;
    const Entry* shared = nullptr;
    for_each([&](Entry& e) {
      if (e.device_tensor == t.unsafeGetTensorImpl()) {
        known = &e;
      } else if (e.first_on_storage && e.device_storage == device_storage) {
        shared = &e;
      }
    });
    if (known != nullptr) {
      return {known, false};
    }
    Entry& e = inline_.size() < kInline ? inline_.emplace_back() : more_.emplace_back();
    e.device_tensor = t.unsafeGetTensorImpl();
    e.device_storage = device_storage;
    e.first_on_storage = shared == nullptr;
    if (staged_) {
      c10::Storage host = shared != nullptr ? shared->alias.storage() : host_copy(t.storage());
      e.alias = t.is_nested() ? nested_tensor_on(host, at::Tensor(t)) : cpu_alias(t, host);
    } else if (t.is_nested()) {
      // A NestedTensorCPU view of the same bytes, for torch's nested CPU kernels.
      e.alias = nested_tensor_on(
          shared != nullptr ? shared->alias.storage() : cpu_alias_storage(t.storage()), at::Tensor(t));
    } else if (shared != nullptr) {
      e.alias = cpu_alias(t, shared->alias.storage());
    } else {
      e.alias = detail::operand_alias(t, pool());
      e.pooled = true;
    }
    e.made = e.alias.unsafeGetTensorImpl();
    return {&e, true};
  }

  template <class F>
  void for_each(F&& f) {
    for (Entry& e : inline_) {
      f(e);
    }
    for (Entry& e : more_) {
      f(e);
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (const Entry& e : inline_) {
      f(e);
    }
    for (const Entry& e : more_) {
      f(e);
    }
  }

  // Ends every alias (the CPU code must hold none but what it kept); the
  // destructor does if nobody did.
  void end() {
    for (auto it = more_.rbegin(); it != more_.rend(); ++it) {
      end(*it);
    }
    for (auto it = inline_.rbegin(); it != inline_.rend(); ++it) {
      end(*it);
    }
    more_.clear();
    inline_.clear();
  }

 private:
  detail::CpuAliasPool& pool() {
    // Each use of a thread_local with a destructor is a call into the dynamic
    // linker (the extension is dlopen'ed): fetched once per call, and only by
    // calls with an operand alias.
    if (pool_ == nullptr) {
      pool_ = &detail::cpu_alias_pool();
    }
    return *pool_;
  }

  void end(Entry& e) {
    if (e.first_on_storage && e.pooled && e.alias.unsafeGetTensorImpl() == e.made) {
      detail::end_operand_alias(std::move(e.alias), e.device_storage, *pool_);
    } else {
      e.alias.reset();
    }
  }

  const bool staged_;
  detail::CpuAliasPool* pool_ = nullptr;
  c10::SmallVector<Entry, kInline> inline_;
  std::list<Entry> more_;
};

// A CPU alias of `t` for the length of a kernel call on it (`t` must outlive
// it), ended (recycled) afterwards.
class ScopedCpuAlias {
 public:
  explicit ScopedCpuAlias(const at::TensorBase& t) : alias_(aliases_.get(t).first->alias) {}
  const at::Tensor& get() const {
    return alias_;
  }
  at::Tensor& get() {
    return alias_;
  }

 private:
  CpuAliases<1> aliases_;
  at::Tensor& alias_;
};

} // namespace openreg
