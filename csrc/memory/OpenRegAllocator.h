// The PrivateUse1 device allocator. It subclasses c10::DeviceAllocator because
// torch.accelerator's memory APIs (memory_allocated, memory_stats, ...) reach the
// backend only through that interface (c10/core/CachingDeviceAllocator.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>
#include <sys/types.h>

#include "runtime/OpenRegRuntime.h"

namespace openreg {

c10::DeviceAllocator* device_allocator();

// device_allocator()->allocate(nbytes) on openreg:`device` (a valid index)
// instead of the current device, without switching devices.
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);

// torch.openreg.caching_allocator_enable, as CUDA's allocator enable(): off,
// each allocation is a runtime allocation of its own and each free returns it
// (OpenRegAllocator.cpp). PYTORCH_NO_OPENREG_MEMORY_CACHING=1 starts it off.
void set_caching_allocator_enabled(bool enabled);
bool caching_allocator_enabled();

// torch.openreg.memory.change_current_allocator(OpenRegPluggableAllocator(...)),
// as CUDA's CUDAPluggableAllocator: every later allocation comes from `alloc`
// (device memory of `device`, e.g. from orMalloc) and goes back through
// `free`, with the size, device and stream of its allocation. Only before the
// first allocation of the process (else RuntimeError).
struct PluggableAllocator {
  void* (*alloc)(ssize_t size, int device, orStream_t stream);
  void (*free)(void* ptr, ssize_t size, int device, orStream_t stream);
};
void change_current_allocator(PluggableAllocator allocator);

// Grows or shrinks a device storage to `new_nbytes`, keeping its contents (as
// resize_bytes_cpu does for CPU, but moving bytes with the runtime's memcpy).
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes);

// torch.openreg.caching_allocator_alloc / _delete, as CUDA's raw_alloc and
// raw_delete: `nbytes` of openreg:`device` from the pool of `stream` (of that
// device), held by the allocator until raw_delete(ptr) gives it back.
void* raw_alloc(c10::DeviceIndex device, size_t nbytes, c10::StreamId stream);
void raw_delete(void* ptr);

// torch.openreg.MemPool and use_mem_pool, as CUDA's private pools: a pool of
// openreg:`device` named (0, id); while a thread allocates to it
// (begin_allocate_to_pool until end_allocate_to_pool), its allocations on
// that device come from the pool's own segments. A pool lives while it has
// uses (the MemPool object's, one per begin) and keeps its cached segments
// until then.
struct MempoolOptions {
  // Where the pool's segments come from and go back to (alloc and free null:
  // the runtime, as for the default pools), as MemPool(allocator=) of CUDA.
  PluggableAllocator allocator{nullptr, nullptr};
  bool use_on_oom = false; // an allocation outside the pool that finds no memory may take its cached blocks
  bool no_split = false; // its blocks are never split: each allocation takes a whole cached block
};
uint64_t create_mempool(c10::DeviceIndex device, const MempoolOptions& options);
// An id no pool has yet (torch.openreg.graph_pool_handle).
uint64_t new_mempool_id();
// Graph capture (OpenRegGraph.cpp): while `stream` of `device` is captured,
// what it allocates, from any thread, comes from private pool `mempool`,
// made now if it does not exist; the capture takes one use of it, which
// release_mempool gives back when the graph is reset.
void begin_capture_to_pool(c10::DeviceIndex device, c10::StreamId stream, uint64_t mempool);
void end_capture_to_pool(c10::DeviceIndex device, c10::StreamId stream, uint64_t mempool);
void begin_allocate_to_pool(c10::DeviceIndex device, uint64_t mempool);
void end_allocate_to_pool(c10::DeviceIndex device, uint64_t mempool);
void release_mempool(c10::DeviceIndex device, uint64_t mempool);
int mempool_use_count(c10::DeviceIndex device, uint64_t mempool);

// torch.openreg.set_per_process_memory_fraction: the caching allocator of
// openreg:`device` reserves at most `fraction` (0 to 1) of the device's
// capacity, as CUDA's does; a segment beyond it first frees the cache and
// retries, then raises torch.OutOfMemoryError naming the limit.
void set_memory_fraction(c10::DeviceIndex device, double fraction);
double get_memory_fraction(c10::DeviceIndex device);

// Memory history, as CUDACachingAllocator records it for
// torch.cuda.memory._record_memory_history and _snapshot. `gather` (set by
// csrc/python: the Python stack, torch's CapturedTraceback) makes the context
// of an event; it runs in the allocating thread, outside the allocator's lock.
using GatherContext = std::shared_ptr<c10::GatheredContext> (*)();
struct MemoryHistory {
  bool trace = false; // keep a trace of alloc/free/segment events ("all")
  bool block_context = false; // live blocks keep their allocation's context
  bool alloc_context = false; // alloc, segment_alloc and oom events carry one (with trace)
  bool free_context = false; // free events carry one (with trace)
  size_t max_entries = 0; // of the trace, per device; then the oldest go
  GatherContext gather = nullptr; // null: recording is off
};
void record_memory_history(const MemoryHistory& history, bool clear_trace);

enum class TraceAction { kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree, kOom, kSnapshot };
struct TraceEntry {
  TraceAction action;
  uintptr_t addr = 0;
  size_t size = 0;
  c10::StreamId stream = 0;
  int64_t time_us = 0;
  size_t device_free = 0; // for kOom
  std::shared_ptr<c10::GatheredContext> context;
};
struct SnapshotBlock {
  uintptr_t address;
  size_t size;
  size_t requested;
  const char* state; // "active_allocated", "active_pending_free" or "inactive"
  std::shared_ptr<c10::GatheredContext> context;
};
struct SnapshotSegment {
  c10::DeviceIndex device;
  uintptr_t address;
  size_t total_size = 0;
  size_t allocated_size = 0;
  size_t active_size = 0;
  size_t requested_size = 0;
  c10::StreamId stream;
  uint64_t mempool = 0; // its private pool's id (0, mempool); 0: none
  bool large;
  std::vector<SnapshotBlock> blocks;
};
struct MemorySnapshot {
  std::vector<SnapshotSegment> segments; // every device's
  std::vector<std::vector<TraceEntry>> device_traces; // per device, oldest first
};
// The segments and blocks of every device, and the traces recorded so far
// (a "snapshot" event is added to each).
MemorySnapshot memory_snapshot();

} // namespace openreg
