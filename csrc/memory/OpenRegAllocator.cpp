// The caching device allocator, shaped like c10/cuda/CUDACachingAllocator.cpp
// in miniature.
//
// orMalloc is slow (a lock and a search in the runtime), so freed blocks stay
// cached per device and per stream and are reused for later requests:
// - sizes round up to 512 bytes; requests up to 1 MiB come from 2 MiB
//   segments (the small pool), larger ones from segments of 20 MiB or of the
//   request rounded to 2 MiB (the large pool);
// - a cached block is split when it is much larger than the request, and
//   neighbouring free blocks of one segment merge again;
// - a block is only reused on the stream it was allocated on, so work queued
//   on that stream is ordered before the new owner's; record_stream adds
//   streams whose queued work must finish (tracked with events) before reuse;
// - a freed small block is first kept whole, unmerged, in a short list; a
//   request of its exact rounded size on its stream takes it back without the
//   free set's lookup, split and merge (what makes small tensors cheap). The
//   list goes back into the free set before a new segment is made and before
//   segments are released, so it never makes the cache grow;
// - with max_split_size_mb (PYTORCH_OPENREG_ALLOC_CONF, OpenRegAllocatorConfig.h)
//   large blocks of that size are never split, and oversize requests take a
//   cached block only if it wastes at most 20 MiB; with a memory fraction and
//   garbage_collection_threshold, the segments longest unused go back to the
//   runtime before the reserved memory reaches the limit;
// - a private pool (torch.openreg.MemPool, use_mem_pool) has segments of its
//   own: a thread allocating to it takes blocks only from them, and nobody
//   else does; they go back to the runtime once the pool is released;
// - when the runtime is out of memory, cached segments are released and the
//   request retried once; then torch.OutOfMemoryError.
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegAllocatorConfig.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/env.h>

#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"
#include "device/OpenRegGpuTrace.h"
#include "memory/OpenRegSpinLock.h"
#include "device/OpenRegStream.h"

namespace openreg {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::Stat;
using c10::CachingDeviceAllocator::StatType;

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = size_t{1} << 20;
constexpr size_t kSmallBuffer = size_t{2} << 20;
constexpr size_t kLargeBuffer = size_t{20} << 20;
constexpr size_t kMinLargeAlloc = size_t{10} << 20;
constexpr size_t kRoundLarge = size_t{2} << 20;
constexpr size_t kSpareBlocks = 64; // Block objects kept for reuse per device
constexpr size_t kRecentBlocks = 16; // freed small blocks kept whole per device

struct Block;

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const;
};

struct Pool {
  explicit Pool(bool small) : small(small) {}
  const bool small;
  std::set<Block*, BlockOrder> free;
};

struct Block {
  c10::DeviceIndex device;
  c10::StreamId stream; // the stream the block was allocated on
  uint64_t mempool = 0; // the private pool of its segment (0: none)
  size_t size;          // bytes of the block
  size_t requested = 0; // bytes the caller asked for, while allocated
  void* ptr;
  Pool* pool;
  bool allocated = false;
  int pending_events = 0;
  Block* prev = nullptr; // neighbours within the segment
  Block* next = nullptr;
  std::unordered_set<c10::StreamId> stream_uses;
  bool oversize = false; // allocated at max_split_size or more
  bool resident = true; // its pages may hold host memory (release_beyond_threshold gave them back otherwise)
  uint64_t free_since = 0; // the pool's lookup count when it became free (garbage collection's age)
  std::shared_ptr<c10::GatheredContext> context; // of its allocation, while recorded

  Block(c10::DeviceIndex device, c10::StreamId stream, size_t size, void* ptr, Pool* pool)
      : device(device), stream(stream), size(size), ptr(ptr), pool(pool) {}

  bool whole_segment() const {
    return prev == nullptr && next == nullptr;
  }
};

bool BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->mempool != b->mempool) {
    return a->mempool < b->mempool;
  }
  if (a->stream != b->stream) {
    return a->stream < b->stream;
  }
  if (a->size != b->size) {
    return a->size < b->size;
  }
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

size_t round_size(size_t size) {
  return size < kMinBlockSize ? kMinBlockSize : (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t segment_size(size_t rounded) {
  if (rounded <= kSmallSize) {
    return kSmallBuffer;
  }
  if (rounded < kMinLargeAlloc) {
    return kLargeBuffer;
  }
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

// How every out-of-memory error of the allocator ends.
constexpr const char* kOomAdvice =
    " Free tensors you no longer need, or set OPENREG_DEVICE_MEMORY (e.g. OPENREG_DEVICE_MEMORY=16G) before "
    "starting Python to simulate a larger device.";

std::string format_bytes(size_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (bytes >= (size_t{1} << 30)) {
    os << static_cast<double>(bytes) / (size_t{1} << 30) << " GiB";
  } else if (bytes >= (size_t{1} << 20)) {
    os << static_cast<double>(bytes) / (size_t{1} << 20) << " MiB";
  } else if (bytes >= 1024) {
    os << static_cast<double>(bytes) / 1024 << " KiB";
  } else {
    os << bytes << " bytes";
  }
  return os.str();
}

struct DeletedEvent {
  orEvent_t event;
  Block* block;
};

// Memory history (record_memory_history): what gathers the context of an
// allocation and of a free, null where none is recorded; read on every
// allocation and free, so recording off costs one relaxed load.
std::atomic<GatherContext> gather_alloc_context{nullptr};
std::atomic<GatherContext> gather_free_context{nullptr};

// The context of an allocation (alloc) or a free (!alloc), gathered before the
// allocator's lock is taken; null when none is recorded.
std::shared_ptr<c10::GatheredContext> gather_context(bool alloc) {
  const GatherContext gather = (alloc ? gather_alloc_context : gather_free_context).load(std::memory_order_relaxed);
  return C10_LIKELY(gather == nullptr) ? nullptr : gather();
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void raise_external_oom(c10::DeviceIndex device, size_t nbytes, const char* how) {
  size_t free = 0;
  size_t total = 0;
  OPENREG_CHECK(orMemGetInfo(&free, &total));
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, "openreg out of memory. Tried to allocate ", format_bytes(nbytes), " with ", how,
      ". openreg:", static_cast<int>(device), " has a total capacity of ", format_bytes(total), " of which ",
      format_bytes(free),
      " is free.", kOomAdvice);
}

// What a pluggable allocator returns must be device memory of the device
// asked for, at least as large as asked: kernels translate it to their view.
void check_pluggable_allocation(
    const PluggableAllocator& via,
    void* ptr,
    c10::DeviceIndex device,
    size_t nbytes,
    orStream_t stream) {
  if (ptr == nullptr) {
    raise_external_oom(device, nbytes, "the pluggable allocator (its alloc function returned null)");
  }
  orPointerAttributes attributes;
  const bool device_memory = orPointerGetAttributes(&attributes, ptr) == orError::Success &&
      attributes.is_device && attributes.device == device &&
      static_cast<char*>(ptr) + nbytes <= static_cast<char*>(attributes.base) + attributes.size;
  if (!device_memory) {
    via.free(ptr, static_cast<ssize_t>(nbytes), device, stream);
    TORCH_CHECK(
        false, "openreg's pluggable allocator: alloc(", nbytes, ", ", static_cast<int>(device), ", stream) returned ",
        ptr, ", which is not ", nbytes, " bytes of openreg:", static_cast<int>(device),
        "'s memory. Its alloc function must return device memory of the device it is asked for (from "
        "openreg::orMalloc, csrc/runtime/OpenRegRuntime.h).");
  }
}

// Everything the allocator knows of one device, under one lock (a spin lock:
// allocation and free are on every kernel call's path).
class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device) {
    recent_.reserve(kRecentBlocks);
  }

  // `mempool`: the private pool to allocate from (0: none).
  Block* allocate(size_t requested, c10::StreamId stream, uint64_t mempool) {
    std::shared_ptr<c10::GatheredContext> context = gather_context(/*alloc=*/true);
    const std::lock_guard<SpinLock> lock(lock_);
    process_events();
    const size_t size = round_size(requested);
    Pool& pool = size <= kSmallSize ? small_ : large_;
    Block* block = pool.small ? take_recent(stream, mempool, size) : nullptr;
    if (block == nullptr) {
      block = take_cached(pool, stream, mempool, size);
      if (block == nullptr && !recent_.empty()) {
        return_recent();
        block = take_cached(pool, stream, mempool, size);
      }
      if (block == nullptr) {
        if (!pool.small) {
          collect_garbage();
        }
        block = new_segment(pool, stream, mempool, size, requested, context);
      }
      if (block == nullptr) {
        block = take_from_pool_on_oom(pool, stream, mempool, size);
      }
      if (block == nullptr) {
        ++stats_.num_ooms;
        raise_oom(requested, context);
      }
      block = maybe_split(block, size);
    }
    block->allocated = true;
    block->requested = requested;
    block->oversize = !pool.small && size >= allocator_config().max_split_size; // max_split_size >= 20 MiB
    if (block->oversize) {
      stats_.oversize_allocations.increase(1);
    }
    if (C10_UNLIKELY(context != nullptr || history_.trace)) {
      if (history_.block_context) {
        block->context = context;
      }
      trace(TraceAction::kAlloc, block->ptr, block->size, stream, history_.alloc_context ? context : nullptr);
    }
    for (StatType type : {StatType::AGGREGATE, pool_type(pool)}) {
      const auto t = static_cast<size_t>(type);
      stats_.allocation[t].increase(1);
      stats_.active[t].increase(1);
      stats_.allocated_bytes[t].increase(block->size);
      stats_.active_bytes[t].increase(block->size);
      stats_.requested_bytes[t].increase(requested);
    }
    return block;
  }

  void free(Block* block) {
    std::shared_ptr<c10::GatheredContext> context = gather_context(/*alloc=*/false);
    const std::lock_guard<SpinLock> lock(lock_);
    block->allocated = false;
    if (block->oversize) {
      stats_.oversize_allocations.decrease(1);
    }
    if (C10_UNLIKELY(history_.trace || block->context != nullptr)) {
      block->context.reset();
      trace(TraceAction::kFreeRequested, block->ptr, block->size, block->stream, context);
      if (block->stream_uses.empty()) {
        trace(TraceAction::kFreeCompleted, block->ptr, block->size, block->stream, context);
      }
    }
    for (StatType type : {StatType::AGGREGATE, pool_type(*block->pool)}) {
      const auto t = static_cast<size_t>(type);
      stats_.allocation[t].decrease(1);
      stats_.allocated_bytes[t].decrease(block->size);
      stats_.requested_bytes[t].decrease(block->requested);
    }
    if (!block->stream_uses.empty()) {
      // Other streams may still read or write it: reuse waits for their work.
      for (c10::StreamId id : block->stream_uses) {
        orEvent_t event = nullptr;
        OPENREG_CHECK(orEventCreateWithFlags(&event, orEventDisableTiming));
        OPENREG_CHECK(orEventRecord(event, raw_stream(make_stream(device_, id))));
        ++block->pending_events;
        events_.push_back(DeletedEvent{event, block});
      }
      block->stream_uses.clear();
      return;
    }
    if (!block->pool->small) {
      release_to_pool(block);
      return;
    }
    deactivate(*block);
    if (recent_.size() == kRecentBlocks) {
      count_inactive(*recent_.front(), /*entering=*/false);
      merge_into_pool(recent_.front());
      recent_.erase(recent_.begin());
    }
    recent_.push_back(block);
    count_inactive(*block, /*entering=*/true);
  }

  void record_stream(Block* block, c10::StreamId stream) {
    const std::lock_guard<SpinLock> lock(lock_);
    if (stream != block->stream) {
      block->stream_uses.insert(stream);
    }
  }

  // Returns cached segments that no allocation uses to the runtime.
  void empty_cache() {
    const std::lock_guard<SpinLock> lock(lock_);
    synchronize_events();
    release_cached();
  }

  DeviceStats stats() {
    const std::lock_guard<SpinLock> lock(lock_);
    DeviceStats stats = stats_;
    // As CUDA's: the limit in bytes, -1 when there is none.
    stats.max_split_size = static_cast<int64_t>(allocator_config().max_split_size);
    return stats;
  }

  void reset_accumulated() {
    const std::lock_guard<SpinLock> lock(lock_);
    for_each_stat([](Stat& stat) { stat.reset_accumulated(); });
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
  }

  void reset_peak() {
    const std::lock_guard<SpinLock> lock(lock_);
    for_each_stat([](Stat& stat) { stat.reset_peak(); });
  }

  void set_history(const MemoryHistory& history, bool clear_trace) {
    std::vector<TraceEntry> dropped; // contexts released outside the lock
    {
      const std::lock_guard<SpinLock> lock(lock_);
      history_ = history;
      if (clear_trace || !history.trace) {
        dropped.swap(trace_);
        trace_next_ = 0;
      }
    }
  }

  // This device's segments (appended to `segments`) and trace.
  std::vector<TraceEntry> snapshot(std::vector<SnapshotSegment>& segments) {
    const std::lock_guard<SpinLock> lock(lock_);
    process_events();
    for (const auto& [address, first] : segments_) {
      SnapshotSegment segment{device_, address};
      segment.stream = first->stream;
      segment.mempool = first->mempool;
      segment.large = !first->pool->small;
      for (const Block* block = first; block != nullptr; block = block->next) {
        const bool active = block->allocated || block->pending_events > 0;
        segment.total_size += block->size;
        segment.allocated_size += block->allocated ? block->size : 0;
        segment.active_size += active ? block->size : 0;
        segment.requested_size += block->allocated ? block->requested : 0;
        segment.blocks.push_back(SnapshotBlock{
            reinterpret_cast<uintptr_t>(block->ptr), block->size, block->allocated ? block->requested : 0,
            block->allocated ? "active_allocated" : active ? "active_pending_free" : "inactive", block->context});
      }
      segments.push_back(std::move(segment));
    }
    if (history_.trace) {
      push_trace(TraceEntry{TraceAction::kSnapshot});
    }
    // Oldest first: the ring's next slot is its oldest entry once it is full.
    std::vector<TraceEntry> trace(trace_.begin() + static_cast<std::ptrdiff_t>(trace_next_), trace_.end());
    trace.insert(trace.end(), trace_.begin(), trace_.begin() + static_cast<std::ptrdiff_t>(trace_next_));
    return trace;
  }

  // Private pools: created with one use (the MemPool object), one more per
  // use_mem_pool; at no use left the pool is gone and its cached segments go
  // back to the runtime (blocks still in use follow when freed, at the next
  // empty_cache or out-of-memory retry).
  void create_mempool(uint64_t mempool, const MempoolOptions& options) {
    const std::lock_guard<SpinLock> lock(lock_);
    mempools_[mempool] = PrivatePool{1, options};
  }

  // A graph's pool (begin_capture_to_pool): made at the first capture into
  // it, with that capture's use, as CUDA makes a graph's pool.
  void use_or_create_mempool(uint64_t mempool) {
    const std::lock_guard<SpinLock> lock(lock_);
    auto it = mempools_.try_emplace(mempool, PrivatePool{0, MempoolOptions{}}).first;
    ++it->second.uses;
  }

  void use_mempool(uint64_t mempool) {
    const std::lock_guard<SpinLock> lock(lock_);
    auto it = mempools_.find(mempool);
    TORCH_CHECK_VALUE(
        it != mempools_.end(), "memory pool (0, ", mempool, ") of openreg:", static_cast<int>(device_),
        " was released; make a new torch.openreg.MemPool");
    ++it->second.uses;
  }

  void release_mempool(uint64_t mempool) {
    const std::lock_guard<SpinLock> lock(lock_);
    auto it = mempools_.find(mempool);
    if (it == mempools_.end() || --it->second.uses > 0) {
      return;
    }
    mempools_.erase(it);
    synchronize_events();
    release_cached(mempool);
  }

  int mempool_use_count(uint64_t mempool) {
    const std::lock_guard<SpinLock> lock(lock_);
    auto it = mempools_.find(mempool);
    return it == mempools_.end() ? 0 : it->second.uses;
  }

  void set_fraction(double fraction) {
    size_t free = 0;
    size_t total = 0;
    {
      const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
      OPENREG_CHECK(orMemGetInfo(&free, &total));
    }
    const std::lock_guard<SpinLock> lock(lock_);
    fraction_ = fraction;
    allowed_ = static_cast<size_t>(fraction * static_cast<double>(total));
  }

  double fraction() {
    const std::lock_guard<SpinLock> lock(lock_);
    return fraction_;
  }

 private:
  static StatType pool_type(const Pool& pool) {
    return pool.small ? StatType::SMALL_POOL : StatType::LARGE_POOL;
  }

  template <typename Fn>
  void for_each_stat(Fn fn) {
    for (auto* array : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                        &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                        &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
      for (auto& stat : *array) {
        fn(stat);
      }
    }
    fn(stats_.oversize_allocations);
    fn(stats_.oversize_segments);
  }

  // A free block that is part of a split segment counts as an inactive split
  // block while it waits, in the free set or the recently freed list (as
  // CUDA's inactive_split statistics). Whether it is split does not change
  // while it waits: only a block taken out of the free set is split or merged.
  void count_inactive(const Block& block, bool entering) {
    if (block.whole_segment()) {
      return;
    }
    for (StatType type : {StatType::AGGREGATE, pool_type(*block.pool)}) {
      const auto t = static_cast<size_t>(type);
      if (entering) {
        stats_.inactive_split[t].increase(1);
        stats_.inactive_split_bytes[t].increase(block.size);
      } else {
        stats_.inactive_split[t].decrease(1);
        stats_.inactive_split_bytes[t].decrease(block.size);
      }
    }
  }

  // The most recently freed small block of exactly `size` bytes on `stream`.
  Block* take_recent(c10::StreamId stream, uint64_t mempool, size_t size) {
    for (size_t i = recent_.size(); i-- > 0;) {
      Block* block = recent_[i];
      if (block->size == size && block->stream == stream && block->mempool == mempool) {
        recent_.erase(recent_.begin() + static_cast<std::ptrdiff_t>(i));
        count_inactive(*block, /*entering=*/false);
        return block;
      }
    }
    return nullptr;
  }

  // Puts the recently freed blocks into the free set, merged with their free
  // neighbours.
  void return_recent() {
    for (Block* block : recent_) {
      count_inactive(*block, /*entering=*/false);
      merge_into_pool(block);
    }
    recent_.clear();
  }

  Block* take_cached(Pool& pool, c10::StreamId stream, uint64_t mempool, size_t size) {
    Block key(0, stream, size, nullptr, &pool);
    key.mempool = mempool;
    auto it = pool.free.lower_bound(&key);
    if (it == pool.free.end() || (*it)->stream != stream || (*it)->mempool != mempool) {
      return nullptr;
    }
    Block* block = *it;
    if (!pool.small) {
      ++large_lookups_;
      // As CUDA's get_free_block: below max_split_size a request leaves
      // oversize blocks whole; an oversize request takes a block at most
      // kLargeBuffer larger than itself. The free set is ordered by size, so
      // no later block fits either.
      const size_t max_split = allocator_config().max_split_size;
      if ((size < max_split && block->size >= max_split) || (size >= max_split && block->size >= size + kLargeBuffer)) {
        return nullptr;
      }
    }
    spare_node_ = pool.free.extract(it);
    count_inactive(*block, /*entering=*/false);
    block->resident = true;
    return block;
  }

  // The free sets and Block objects change at every small allocation (a
  // split) and free (a merge): their nodes and objects are recycled rather
  // than allocated each time, which is most of what a small allocation costs.
  void insert_free(Pool& pool, Block* block) {
    count_inactive(*block, /*entering=*/true);
    block->free_since = large_lookups_;
    if (spare_node_.empty()) {
      pool.free.insert(block);
      return;
    }
    spare_node_.value() = block;
    pool.free.insert(std::move(spare_node_));
  }

  bool take_free(Pool& pool, Block* block) {
    auto it = pool.free.find(block);
    if (it == pool.free.end()) {
      return false;
    }
    spare_node_ = pool.free.extract(it);
    count_inactive(*block, /*entering=*/false);
    return true;
  }

  Block* make_block(c10::StreamId stream, size_t size, void* ptr, Pool* pool) {
    if (spare_blocks_.empty()) {
      return new Block(device_, stream, size, ptr, pool);
    }
    Block* block = spare_blocks_.back();
    spare_blocks_.pop_back();
    *block = Block(device_, stream, size, ptr, pool);
    return block;
  }

  void retire_block(Block* block) {
    if (spare_blocks_.size() < kSpareBlocks) {
      spare_blocks_.push_back(block);
    } else {
      delete block;
    }
  }

  // `context`: the allocation's, for the segment_alloc and oom events.
  Block* new_segment(
      Pool& pool,
      c10::StreamId stream,
      uint64_t mempool,
      size_t size,
      size_t requested,
      const std::shared_ptr<c10::GatheredContext>& context) {
    const size_t bytes = segment_size(size);
    const PluggableAllocator* via = pool_allocator(mempool);
    void* ptr = nullptr;
    orError status = device_malloc(&ptr, bytes, via, stream);
    if (status == orError::MemoryAllocation) {
      // Free what the cache holds and try once more, as CUDA's allocator does.
      ++stats_.num_alloc_retries;
      synchronize_events();
      release_cached();
      status = device_malloc(&ptr, bytes, via, stream);
    }
    if (status == orError::MemoryAllocation) {
      return nullptr;
    }
    OPENREG_CHECK(status);
    if (via != nullptr) {
      allocator_segments_.emplace(ptr, *via);
    }
    for (StatType type : {StatType::AGGREGATE, pool_type(pool)}) {
      const auto t = static_cast<size_t>(type);
      stats_.segment[t].increase(1);
      stats_.reserved_bytes[t].increase(bytes);
    }
    if (size >= allocator_config().max_split_size) {
      stats_.oversize_segments.increase(1);
      oversize_segments_.insert(ptr);
    }
    Block* block = make_block(stream, bytes, ptr, &pool);
    block->mempool = mempool;
    segments_[reinterpret_cast<uintptr_t>(ptr)] = block;
    trace(TraceAction::kSegmentAlloc, ptr, bytes, stream, history_.alloc_context ? context : nullptr);
    return block;
  }

  // `via`: the private pool's allocator (null: the runtime).
  orError device_malloc(void** ptr, size_t bytes, const PluggableAllocator* via, c10::StreamId stream) {
    const auto reserved = static_cast<size_t>(stats_.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].current);
    if (fraction_ < 1.0 && reserved + bytes > allowed_) {
      return orError::MemoryAllocation; // set_per_process_memory_fraction's limit
    }
    const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
    if (via != nullptr) {
      const orStream_t raw = raw_stream(make_stream(device_, stream));
      *ptr = via->alloc(static_cast<ssize_t>(bytes), device_, raw);
      if (*ptr == nullptr) {
        return orError::MemoryAllocation;
      }
      check_pluggable_allocation(*via, *ptr, device_, bytes, raw);
      ++stats_.num_device_alloc;
      return orError::Success;
    }
    const orError status = orMalloc(ptr, bytes);
    if (status == orError::Success) {
      ++stats_.num_device_alloc;
    }
    return status;
  }

  const PluggableAllocator* pool_allocator(uint64_t mempool) const {
    if (mempool == 0) {
      return nullptr;
    }
    auto it = mempools_.find(mempool);
    return it != mempools_.end() && it->second.options.allocator.alloc != nullptr ? &it->second.options.allocator
                                                                                  : nullptr;
  }

  // MemPool(use_on_oom=True), as CUDA's: an allocation outside every private
  // pool that found no device memory takes a cached block of such a pool.
  Block* take_from_pool_on_oom(Pool& pool, c10::StreamId stream, uint64_t mempool, size_t size) {
    if (mempool != 0) {
      return nullptr;
    }
    for (const auto& [id, private_pool] : mempools_) {
      if (private_pool.options.use_on_oom) {
        if (Block* block = take_cached(pool, stream, id, size)) {
          return block;
        }
      }
    }
    return nullptr;
  }

  [[noreturn]] void raise_oom(size_t requested, const std::shared_ptr<c10::GatheredContext>& context) {
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    size_t free = 0;
    size_t total = 0;
    {
      const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
      OPENREG_CHECK(orMemGetInfo(&free, &total));
    }
    const auto allocated = static_cast<size_t>(stats_.allocated_bytes[agg].current);
    const auto reserved = static_cast<size_t>(stats_.reserved_bytes[agg].current);
    if (history_.trace) {
      TraceEntry entry{TraceAction::kOom};
      entry.size = requested;
      entry.device_free = free;
      entry.context = history_.alloc_context ? context : nullptr;
      push_trace(std::move(entry));
    }
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "openreg out of memory. Tried to allocate ", format_bytes(requested),
        ". openreg:", static_cast<int>(device_), " has a total capacity of ", format_bytes(total), " of which ",
        format_bytes(free), " is free. Of the allocated memory ", format_bytes(allocated),
        " is allocated by PyTorch, and ", format_bytes(reserved - allocated),
        " is reserved by PyTorch but unallocated.",
        fraction_ < 1.0 ? c10::str(
                              " This process may reserve ", format_bytes(allowed_),
                              " of it (set_per_process_memory_fraction(", fraction_, ")).")
                        : std::string(),
        kOomAdvice);
  }

  // Splits off the tail of a block much larger than `size` as a free block.
  Block* maybe_split(Block* block, size_t size) {
    if (block->mempool != 0) {
      auto it = mempools_.find(block->mempool);
      if (it != mempools_.end() && it->second.options.no_split) {
        return block;
      }
    }
    const size_t remaining = block->size - size;
    const bool split = block->pool->small ? remaining >= kMinBlockSize
                                          : size < allocator_config().max_split_size && remaining > kSmallSize;
    if (!split) {
      return block;
    }
    Block* rest = make_block(block->stream, remaining, static_cast<char*>(block->ptr) + size, block->pool);
    rest->mempool = block->mempool;
    rest->resident = block->resident;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) {
      rest->next->prev = rest;
    }
    block->next = rest;
    block->size = size;
    insert_free(*block->pool, rest);
    return block;
  }

  void deactivate(const Block& block) {
    for (StatType type : {StatType::AGGREGATE, pool_type(*block.pool)}) {
      const auto t = static_cast<size_t>(type);
      stats_.active[t].decrease(1);
      stats_.active_bytes[t].decrease(block.size);
    }
  }

  void release_to_pool(Block* block) {
    deactivate(*block);
    merge_into_pool(block);
    if (!block->pool->small) {
      release_beyond_threshold();
    }
  }

  // Device memory is the process's memory: cached free large blocks beyond
  // release_threshold_mb (OpenRegAllocatorConfig.h) give their pages back,
  // the largest first, so resident memory follows what is allocated. Only
  // blocks whose stream has finished its work: a kernel queued before the
  // free may still use the memory. Private pools (graphs) keep theirs.
  void release_beyond_threshold() {
    const size_t threshold = allocator_config().release_threshold;
    // The large pool's free bytes bound its resident free bytes: below the
    // threshold (the usual case) no block needs looking at.
    const auto large = static_cast<size_t>(StatType::LARGE_POOL);
    const int64_t free_bytes = stats_.reserved_bytes[large].current - stats_.active_bytes[large].current;
    if (free_bytes <= 0 || static_cast<size_t>(free_bytes) <= threshold) {
      return;
    }
    size_t resident = 0;
    for (const Block* b : large_.free) {
      resident += b->resident ? b->size : 0;
    }
    for (auto it = large_.free.rbegin(); it != large_.free.rend() && resident > threshold; ++it) {
      Block* b = *it;
      bool idle = false;
      // (A negative stream id is a stream worker's own pool: kernels allocate
      // from it as they run.)
      if (!b->resident || b->mempool != 0 || b->stream < 0 ||
          orStreamIsIdle(raw_stream(make_stream(device_, b->stream)), &idle) != orError::Success || !idle) {
        continue;
      }
      OPENREG_CHECK(orMemDiscard(b->ptr, b->size));
      b->resident = false;
      resident -= b->size;
    }
  }

  void merge_into_pool(Block* block) {
    for (Block* neighbour : {block->prev, block->next}) {
      if (neighbour != nullptr && !neighbour->allocated && neighbour->pending_events == 0 &&
          take_free(*block->pool, neighbour)) {
        merge(block, neighbour);
      }
    }
    insert_free(*block->pool, block);
  }

  void merge(Block* into, Block* other) {
    if (other == into->prev) {
      into->ptr = other->ptr;
      into->prev = other->prev;
      if (into->prev != nullptr) {
        into->prev->next = into;
      } else {
        segments_[reinterpret_cast<uintptr_t>(into->ptr)] = into; // the segment's first block now
      }
    } else {
      into->next = other->next;
      if (into->next != nullptr) {
        into->next->prev = into;
      }
    }
    into->size += other->size;
    into->resident = into->resident || other->resident;
    retire_block(other);
  }

  void process_events() {
    while (!events_.empty()) {
      const DeletedEvent& front = events_.front();
      const orError status = orEventQuery(front.event);
      if (status == orError::NotReady) {
        return;
      }
      finish_event(front);
      events_.pop_front();
    }
  }

  void synchronize_events() {
    for (const DeletedEvent& e : events_) {
      OPENREG_CHECK(orEventSynchronize(e.event));
      finish_event(e);
    }
    events_.clear();
  }

  void finish_event(const DeletedEvent& e) {
    OPENREG_CHECK(orEventDestroy(e.event));
    if (--e.block->pending_events == 0) {
      trace(TraceAction::kFreeCompleted, e.block->ptr, e.block->size, e.block->stream, nullptr);
      release_to_pool(e.block);
    }
  }

  // Every releasable cached segment, or only those of the released private
  // pool `only` (the default pools' cache stays when a private pool goes).
  void release_cached(std::optional<uint64_t> only = std::nullopt) {
    return_recent();
    for (Pool* pool : {&small_, &large_}) {
      for (auto it = pool->free.begin(); it != pool->free.end();) {
        Block* block = *it;
        if (!block->whole_segment() || mempools_.count(block->mempool) > 0 ||
            (only.has_value() && block->mempool != *only)) {
          ++it; // a live private pool keeps its segments
          continue;
        }
        it = pool->free.erase(it);
        release_segment(block);
      }
    }
  }

  // Returns a whole cached segment, out of its free set, to the runtime.
  void release_segment(Block* block) {
    auto via = allocator_segments_.find(block->ptr);
    if (via != allocator_segments_.end()) {
      const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
      via->second.free(
          block->ptr, static_cast<ssize_t>(block->size), device_, raw_stream(make_stream(device_, block->stream)));
      allocator_segments_.erase(via);
    } else {
      OPENREG_CHECK(orFree(block->ptr));
    }
    ++stats_.num_device_free;
    segments_.erase(reinterpret_cast<uintptr_t>(block->ptr));
    if (oversize_segments_.erase(block->ptr) > 0) {
      stats_.oversize_segments.decrease(1);
    }
    trace(TraceAction::kSegmentFree, block->ptr, block->size, block->stream, nullptr);
    for (StatType type : {StatType::AGGREGATE, pool_type(*block->pool)}) {
      const auto t = static_cast<size_t>(type);
      stats_.segment[t].decrease(1);
      stats_.reserved_bytes[t].decrease(block->size);
    }
    delete block;
  }

  // garbage_collection_threshold, as CUDA's garbage_collect_cached_blocks:
  // with a memory fraction set, once the reserved memory exceeds the
  // threshold's share of what the fraction allows, the cached large segments
  // whose age (large-pool lookups since they became free) is at least the
  // average go back to the runtime, round after round, until the excess is
  // reclaimed. No event is waited for, unlike release_cached.
  void collect_garbage() {
    const double threshold = allocator_config().garbage_collection_threshold;
    if (threshold <= 0.0 || fraction_ >= 1.0) {
      return;
    }
    const auto limit = static_cast<size_t>(threshold * static_cast<double>(allowed_));
    const auto reserved = static_cast<size_t>(stats_.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].current);
    if (reserved <= limit) {
      return;
    }
    uint64_t total_age = 0;
    size_t candidates = 0;
    for (const Block* block : large_.free) {
      if (block->whole_segment() && block->mempool == 0) {
        total_age += large_lookups_ - block->free_since;
        ++candidates;
      }
    }
    size_t reclaimed = 0;
    bool freed = true;
    while (reclaimed < reserved - limit && freed && candidates > 0) {
      const double average_age = static_cast<double>(total_age) / static_cast<double>(candidates);
      freed = false;
      for (auto it = large_.free.begin(); it != large_.free.end();) {
        Block* block = *it;
        const uint64_t age = large_lookups_ - block->free_since;
        if (!block->whole_segment() || block->mempool != 0 || static_cast<double>(age) < average_age) {
          ++it;
          continue;
        }
        it = large_.free.erase(it);
        reclaimed += block->size;
        total_age -= age;
        --candidates;
        freed = true;
        release_segment(block);
      }
    }
  }

  void trace(
      TraceAction action,
      void* addr,
      size_t size,
      c10::StreamId stream,
      std::shared_ptr<c10::GatheredContext> context) {
    if (C10_LIKELY(!history_.trace)) {
      return;
    }
    TraceEntry entry{action, reinterpret_cast<uintptr_t>(addr), size, stream};
    entry.context = std::move(context);
    push_trace(std::move(entry));
  }

  void push_trace(TraceEntry entry) {
    entry.time_us = now_us();
    if (trace_.size() < history_.max_entries) {
      trace_.push_back(std::move(entry));
    } else if (history_.max_entries > 0) {
      trace_[trace_next_] = std::move(entry);
      trace_next_ = (trace_next_ + 1) % history_.max_entries;
    }
  }

  const c10::DeviceIndex device_;
  SpinLock lock_;
  Pool small_{true};
  Pool large_{false};
  std::deque<DeletedEvent> events_;
  DeviceStats stats_;
  // set_per_process_memory_fraction: segments may reserve at most allowed_.
  double fraction_ = 1.0;
  size_t allowed_ = 0;
  // Memory history: the settings, the trace (a ring of max_entries), and
  // every segment by address.
  MemoryHistory history_;
  std::vector<TraceEntry> trace_;
  size_t trace_next_ = 0;
  std::map<uintptr_t, Block*> segments_;
  std::unordered_set<const void*> oversize_segments_; // made for requests of max_split_size or more
  struct PrivatePool {
    int uses;
    MempoolOptions options;
  };
  std::unordered_map<uint64_t, PrivatePool> mempools_; // the live private pools
  // The segments of pools with an allocator, and the allocator each goes back
  // to: a copy, since the pool (and its options) may be gone by then.
  std::unordered_map<const void*, PluggableAllocator> allocator_segments_;
  uint64_t large_lookups_ = 0; // of the large pool's free set: the clock of garbage collection's ages
  std::set<Block*, BlockOrder>::node_type spare_node_;
  std::vector<Block*> spare_blocks_;
  std::vector<Block*> recent_; // freed small blocks, not merged, oldest first
};

// The stream whose pool serves an allocation. The pools are stream-ordered:
// a block freed by the host is handed to later work on its stream, which runs
// after the kernels that used it. A kernel running on a stream's worker is
// behind the host in that order, so what it allocates (a temporary of CPU's
// kernel, an output cast to another dtype) comes from a pool of the worker's
// own, never shared with the host: a host-freed block still used by a queued
// kernel cannot become a running kernel's scratch memory.
c10::StreamId allocation_stream(c10::DeviceIndex device) {
  if (C10_UNLIKELY(orInsideKernel())) {
    static std::atomic<c10::StreamId> next_worker_pool{0};
    // Negative: no stream of c10 has such an id.
    thread_local const c10::StreamId worker_pool = -1 - next_worker_pool.fetch_add(1);
    return worker_pool;
  }
  return current_stream_id(device);
}

// The private pools this thread allocates to, per device, the innermost
// use_mem_pool last; allocations go to the last (none: the default pools).
// The innermost is also kept in a plain array, read on every allocation
// without the vectors' thread-local initialisation.
thread_local std::array<std::vector<uint64_t>, kMaxDevices> allocating_to;
thread_local std::array<uint64_t, kMaxDevices> allocating_pool_of{};

// The private pools of the streams being captured into graphs, per device:
// what those streams allocate comes from them (begin_capture_to_pool), from
// whatever thread (the autograd engine's, for a captured backward).
struct CapturePools {
  std::mutex mutex;
  std::array<std::vector<std::pair<c10::StreamId, uint64_t>>, kMaxDevices> of;
};
CapturePools& capture_pools() {
  static auto* pools = new CapturePools(); // leaked: allocations may come after static dtors
  return *pools;
}

uint64_t allocating_pool(c10::DeviceIndex device) {
  if (C10_UNLIKELY(orStreamCaptureUnderway()) && !orInsideKernel()) {
    const c10::StreamId stream = current_stream_id(device);
    CapturePools& pools = capture_pools();
    const std::lock_guard<std::mutex> lock(pools.mutex);
    for (const auto& [captured, mempool] : pools.of[device]) {
      if (captured == stream) {
        return mempool;
      }
    }
  }
  return allocating_pool_of[device];
}

class OpenRegAllocator;
OpenRegAllocator& allocator_instance();

class OpenRegAllocator final : public c10::DeviceAllocator {
 public:
  OpenRegAllocator() {
    for (c10::DeviceIndex i = 0; i < kMaxDevices; ++i) {
      caches_[i] = std::make_unique<DeviceCache>(i);
    }
    // As PYTORCH_NO_CUDA_MEMORY_CACHING for CUDA's allocator.
    caching_enabled_.store(c10::utils::check_env("PYTORCH_NO_OPENREG_MEMORY_CACHING") != true);
    update_bypass();
  }

  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_on(current_device(), nbytes);
  }

  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
    const c10::Device where(c10::DeviceType::PrivateUse1, device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &delete_block, where};
    }
    if (C10_UNLIKELY(bypass_cache_.load(std::memory_order_relaxed))) {
      return allocate_external(device, nbytes);
    }
    Block* block = caches_[device]->allocate(nbytes, allocation_stream(device), allocating_pool(device));
    // Outside the cache's lock, as CUDACachingAllocator's malloc reports it:
    // the hook takes the GIL.
    gpu_trace::memory_allocation(block->ptr);
    return {block->ptr, block, &delete_block, where};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr; // contexts differ from data pointers, so no raw deleter
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    OPENREG_CHECK(orMemcpy(dest, src, count, orMemcpyKind::DeviceToDevice));
  }

  bool initialized() override {
    return is_initialized();
  }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    release_deferred_frees();
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      caches_[i]->empty_cache();
    }
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get_deleter() != &delete_block || ptr.get_context() == nullptr) {
      return; // not ours (or empty): nothing to track, as in CUDA
    }
    auto* block = static_cast<Block*>(ptr.get_context());
    TORCH_CHECK(
        stream.device() == c10::Device(c10::DeviceType::PrivateUse1, block->device),
        "record_stream: the stream is on ", stream.device(), " but the tensor's memory is on openreg:",
        static_cast<int>(block->device), "; record a stream of the tensor's own device.");
    // Validate the stream id now, while the caller can get the error: the
    // free that records an event on it runs in the DataPtr's deleter, where a
    // throw is std::terminate.
    (void)raw_stream(stream);
    caches_[block->device]->record_stream(block, stream.id());
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device_index(device);
    return caches_[device]->stats();
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device_index(device);
    caches_[device]->reset_accumulated();
  }

  void record_history(const MemoryHistory& history, bool clear_trace) {
    for (const auto& cache : caches_) {
      cache->set_history(history, clear_trace);
    }
  }

  MemorySnapshot snapshot() {
    MemorySnapshot out;
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      out.device_traces.push_back(caches_[i]->snapshot(out.segments));
    }
    return out;
  }

  DeviceCache& cache(c10::DeviceIndex device) {
    check_device_index(device);
    return *caches_[device];
  }

  void set_memory_fraction(c10::DeviceIndex device, double fraction) {
    check_device_index(device);
    caches_[device]->set_fraction(fraction);
  }

  double get_memory_fraction(c10::DeviceIndex device) {
    check_device_index(device);
    return caches_[device]->fraction();
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device_index(device);
    caches_[device]->reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
    size_t free = 0;
    size_t total = 0;
    OPENREG_CHECK(orMemGetInfo(&free, &total));
    return {free, total};
  }

  void free_block(Block* block) {
    caches_[block->device]->free(block);
  }

  // Allocations outside the cache: each one a device allocation of its own,
  // given back when its tensor goes. Two sources:
  // - the caching allocator off (caching_allocator_enable(False),
  //   PYTORCH_NO_OPENREG_MEMORY_CACHING=1), as CUDA's uncached mode: orMalloc
  //   and orFree, which waits for the device's streams as cudaFree does, so
  //   memory goes back as soon as its tensor goes and an address kept past the
  //   tensor's life points to freed (zeroed) pages, not a reused block;
  // - a pluggable allocator (change_current_allocator), as CUDA's
  //   CUDAPluggableAllocator: a library's alloc and free functions.
  // Blocks allocated by the cache before stay in the cache. Memory outside the
  // cache is not in its statistics, as in CUDA.
  void set_caching_enabled(bool enabled) {
    caching_enabled_.store(enabled, std::memory_order_relaxed);
    update_bypass();
  }

  bool caching_enabled() const {
    return caching_enabled_.load(std::memory_order_relaxed);
  }

  void change_allocator(PluggableAllocator allocator) {
    TORCH_CHECK_VALUE(
        allocator.alloc != nullptr && allocator.free != nullptr,
        "change_current_allocator: the allocator's alloc and free functions must not be null.");
    const std::lock_guard<std::mutex> lock(deferred_mutex_);
    bool used = external_allocations_.load() > 0;
    for (c10::DeviceIndex i = 0; i < kMaxDevices && !used; ++i) {
      used = caches_[i]->stats().num_device_alloc > 0;
    }
    TORCH_CHECK(
        !used, "change_current_allocator: can't swap an already initialized allocator: openreg has allocated "
        "device memory in this process. Change the allocator before the first openreg tensor is made.");
    pluggable_.store(new PluggableAllocator(allocator)); // leaked: frees may come after static dtors
    update_bypass();
  }

 private:
  static void delete_block(void* ctx);

  // One allocation outside the cache, the context of its DataPtr: what a
  // pluggable allocator's free is told.
  struct ExternalAllocation {
    void* ptr;
    size_t size;
    c10::DeviceIndex device;
    orStream_t stream;
    const PluggableAllocator* via; // null: orMalloc
  };

  void update_bypass() {
    bypass_cache_.store(!caching_enabled() || pluggable_.load() != nullptr, std::memory_order_relaxed);
  }

  c10::DataPtr allocate_external(c10::DeviceIndex device, size_t nbytes) {
    release_deferred_frees();
    const c10::Device where(c10::DeviceType::PrivateUse1, device);
    const c10::DeviceGuard guard(where);
    const PluggableAllocator* via = pluggable_.load();
    const orStream_t stream = current_raw_stream(device);
    void* ptr = nullptr;
    if (via != nullptr) {
      ptr = via->alloc(static_cast<ssize_t>(nbytes), device, stream);
      check_pluggable_allocation(*via, ptr, device, nbytes, stream);
    } else {
      orError status = orMalloc(&ptr, nbytes);
      if (status == orError::MemoryAllocation && !orInsideKernel()) {
        caches_[device]->empty_cache(); // what the cache kept from before caching was turned off
        status = orMalloc(&ptr, nbytes);
      }
      if (status == orError::MemoryAllocation) {
        raise_external_oom(device, nbytes, "the caching allocator disabled (caching_allocator_enable(False) or "
                                           "PYTORCH_NO_OPENREG_MEMORY_CACHING=1)");
      }
      OPENREG_CHECK(status);
    }
    external_allocations_.fetch_add(1, std::memory_order_relaxed);
    gpu_trace::memory_allocation(ptr);
    auto* record = new ExternalAllocation{ptr, nbytes, device, stream, via};
    return {ptr, record, &delete_external, where};
  }

  static void delete_external(void* ctx) {
    auto* record = static_cast<ExternalAllocation*>(ctx);
    gpu_trace::memory_deallocation(record->ptr);
    OpenRegAllocator& self = allocator_instance();
    if (orInsideKernel()) {
      // orFree waits for the device's other streams, which may be waiting for
      // this worker: the next allocation or free outside the cache on a host
      // thread frees it.
      const std::lock_guard<std::mutex> lock(self.deferred_mutex_);
      self.deferred_frees_.push_back(record);
      return;
    }
    self.release_deferred_frees();
    free_external(record);
  }

  static void free_external(ExternalAllocation* record) {
    if (record->via != nullptr) {
      record->via->free(record->ptr, static_cast<ssize_t>(record->size), record->device, record->stream);
    } else if (const orError status = orFree(record->ptr); status != orError::Success) {
      TORCH_WARN("openreg: freeing uncached device memory ", record->ptr, " failed: ", orGetErrorString(status));
    }
    delete record;
  }

  void release_deferred_frees() {
    std::vector<ExternalAllocation*> frees;
    {
      const std::lock_guard<std::mutex> lock(deferred_mutex_);
      if (deferred_frees_.empty() || orInsideKernel()) {
        return;
      }
      frees.swap(deferred_frees_);
    }
    for (ExternalAllocation* record : frees) {
      free_external(record);
    }
  }

  std::atomic<bool> bypass_cache_{false}; // caching off or a pluggable allocator: one load per allocation
  std::atomic<bool> caching_enabled_{true};
  std::atomic<const PluggableAllocator*> pluggable_{nullptr}; // set once, before any allocation
  std::atomic<uint64_t> external_allocations_{0};
  std::mutex deferred_mutex_;
  std::vector<ExternalAllocation*> deferred_frees_; // freed by a stream's worker

  std::array<std::unique_ptr<DeviceCache>, kMaxDevices> caches_;
};

OpenRegAllocator& allocator_instance() {
  static auto* instance = new OpenRegAllocator(); // leaked: tensors may die after static dtors
  return *instance;
}

void OpenRegAllocator::delete_block(void* ctx) {
  if (ctx != nullptr) {
    // When the tensor lets go of the block, whatever record_stream deferred,
    // as CUDACachingAllocator's free reports it.
    gpu_trace::memory_deallocation(static_cast<Block*>(ctx)->ptr);
    allocator_instance().free_block(static_cast<Block*>(ctx));
  }
}

// REGISTER_ALLOCATOR (c10/core/Allocator.h) installs it for every PrivateUse1 storage.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &allocator_instance());

} // namespace

c10::DeviceAllocator* device_allocator() {
  return &allocator_instance();
}

void set_memory_fraction(c10::DeviceIndex device, double fraction) {
  TORCH_CHECK_VALUE(
      fraction >= 0.0 && fraction <= 1.0, "Invalid fraction value: ", fraction, ". Allowed range: 0~1");
  allocator_instance().set_memory_fraction(device, fraction);
}

double get_memory_fraction(c10::DeviceIndex device) {
  return allocator_instance().get_memory_fraction(device);
}

uint64_t new_mempool_id() {
  static std::atomic<uint64_t> next_id{1};
  return next_id.fetch_add(1);
}

uint64_t create_mempool(c10::DeviceIndex device, const MempoolOptions& options) {
  const uint64_t mempool = new_mempool_id();
  allocator_instance().cache(device).create_mempool(mempool, options);
  return mempool;
}

void begin_capture_to_pool(c10::DeviceIndex device, c10::StreamId stream, uint64_t mempool) {
  allocator_instance().cache(device).use_or_create_mempool(mempool);
  CapturePools& pools = capture_pools();
  const std::lock_guard<std::mutex> lock(pools.mutex);
  pools.of[device].emplace_back(stream, mempool);
}

void end_capture_to_pool(c10::DeviceIndex device, c10::StreamId stream, uint64_t mempool) {
  CapturePools& pools = capture_pools();
  const std::lock_guard<std::mutex> lock(pools.mutex);
  auto& of = pools.of[device];
  auto it = std::find(of.begin(), of.end(), std::make_pair(stream, mempool));
  if (it != of.end()) {
    of.erase(it);
  }
}

void begin_allocate_to_pool(c10::DeviceIndex device, uint64_t mempool) {
  allocator_instance().cache(device).use_mempool(mempool);
  allocating_to[device].push_back(mempool);
  allocating_pool_of[device] = mempool;
}

void end_allocate_to_pool(c10::DeviceIndex device, uint64_t mempool) {
  DeviceCache& cache = allocator_instance().cache(device);
  std::vector<uint64_t>& pools = allocating_to[device];
  auto it = std::find(pools.rbegin(), pools.rend(), mempool);
  TORCH_CHECK_VALUE(
      it != pools.rend(), "end_allocate_to_pool: this thread does not allocate to memory pool (0, ", mempool,
      ") of openreg:", static_cast<int>(device));
  pools.erase(std::next(it).base());
  allocating_pool_of[device] = pools.empty() ? 0 : pools.back();
  cache.release_mempool(mempool);
}

void release_mempool(c10::DeviceIndex device, uint64_t mempool) {
  allocator_instance().cache(device).release_mempool(mempool);
}

int mempool_use_count(c10::DeviceIndex device, uint64_t mempool) {
  return allocator_instance().cache(device).mempool_use_count(mempool);
}

void record_memory_history(const MemoryHistory& history, bool clear_trace) {
  allocator_instance().record_history(history, clear_trace);
  gather_alloc_context.store(
      history.block_context || history.alloc_context ? history.gather : nullptr, std::memory_order_relaxed);
  gather_free_context.store(history.free_context ? history.gather : nullptr, std::memory_order_relaxed);
}

MemorySnapshot memory_snapshot() {
  return allocator_instance().snapshot();
}

c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
  return allocator_instance().allocate_on(device, nbytes);
}

void set_caching_allocator_enabled(bool enabled) {
  allocator_instance().set_caching_enabled(enabled);
}

bool caching_allocator_enabled() {
  return allocator_instance().caching_enabled();
}

void change_current_allocator(PluggableAllocator allocator) {
  allocator_instance().change_allocator(allocator);
}

namespace {
// The blocks raw_alloc handed out, by address.
std::mutex raw_mutex;
std::unordered_map<void*, c10::DataPtr>& raw_blocks() {
  static auto* blocks = new std::unordered_map<void*, c10::DataPtr>(); // leaked: freed blocks may die after static dtors
  return *blocks;
}
} // namespace

void* raw_alloc(c10::DeviceIndex device, size_t nbytes, c10::StreamId stream) {
  check_device_index(device);
  c10::DataPtr data;
  {
    const c10::StreamGuard guard(make_stream(device, stream)); // the pool is the current stream's
    data = allocator_instance().allocate_on(device, nbytes);
  }
  void* ptr = data.get();
  if (ptr != nullptr) {
    const std::lock_guard<std::mutex> lock(raw_mutex);
    raw_blocks().emplace(ptr, std::move(data));
  }
  return ptr;
}

void raw_delete(void* ptr) {
  c10::DataPtr data; // freed outside the lock
  {
    const std::lock_guard<std::mutex> lock(raw_mutex);
    auto it = raw_blocks().find(ptr);
    TORCH_CHECK_VALUE(
        it != raw_blocks().end(), "caching_allocator_delete: ", ptr,
        " is not a pointer caching_allocator_alloc returned, or it was deleted already.");
    data = std::move(it->second);
    raw_blocks().erase(it);
  }
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes) {
  TORCH_CHECK(
      storage->resizable(),
      "Trying to resize storage that is not resizable (it wraps memory openreg does not own).");
  const c10::Device device = storage->device();
  TORCH_INTERNAL_ASSERT(device.is_privateuseone(), "resize_storage_bytes got a ", device, " storage");
  c10::DeviceGuard guard(device);
  c10::Allocator* alloc = storage->allocator() != nullptr ? storage->allocator() : device_allocator();
  c10::DataPtr fresh = alloc->allocate(new_nbytes);
  const size_t keep = std::min(storage->nbytes(), new_nbytes);
  if (keep > 0) {
    join_current_stream(device.index());
    OPENREG_CHECK(orMemcpy(fresh.get(), storage->data(), keep, orMemcpyKind::DeviceToDevice));
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(new_nbytes);
}

} // namespace openreg
