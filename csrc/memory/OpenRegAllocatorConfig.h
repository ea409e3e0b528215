// The caching allocator's options, set like PYTORCH_CUDA_ALLOC_CONF: the
// environment variable PYTORCH_OPENREG_ALLOC_CONF ("key:value,key:value"),
// read when openreg initialises, or torch.openreg.memory._set_allocator_settings.
//
// - max_split_size_mb:N (N >= 20): cached blocks of N MiB or more are never
//   split, and a request of N MiB or more takes a cached block only if it is
//   at most 20 MiB larger, as CUDA's allocator does against fragmentation.
//   Allocations and segments of that size count as "oversize" in memory_stats.
// - garbage_collection_threshold:T (0 < T < 1): with a memory fraction set
//   (set_per_process_memory_fraction), once the reserved memory exceeds T of
//   the allowed memory, a request that finds no cached block first returns
//   the cached large segments that have waited longest for reuse.
// - release_threshold_mb:N (default 64): the cached free memory of a device
//   that stays resident; beyond it, cached free blocks whose stream is idle
//   give their pages back to the host, keeping their address range, so the
//   process's resident memory follows memory_allocated rather than
//   memory_reserved (device memory is host memory here; cudaMemPool's
//   release threshold is the same idea on CUDA). A reused block's pages are
//   faulted in again, as for fresh CPU memory.
// - expandable_segments:False. True is refused: the runtime maps each
//   device's memory once, so a segment cannot grow in place.
//
// c10's AcceleratorAllocatorConfig (PYTORCH_ALLOC_CONF) parses the same
// syntax but accepts unknown keys silently and reports a malformed number as
// "stoull"; openreg names the key and the values it accepts.
#pragma once

#include <cstddef>
#include <string>

namespace openreg {

struct AllocatorConfig {
  size_t max_split_size = static_cast<size_t>(-1); // bytes; none by default
  double garbage_collection_threshold = 0.0; // 0: off
  size_t release_threshold = size_t{64} << 20; // bytes
};

// The options in effect (after load_allocator_config or set_allocator_settings).
AllocatorConfig allocator_config();

// Parses `settings` and makes them the options in effect; throws
// c10::ValueError naming the key and its accepted values, and then changes
// nothing. `source` names where the text came from, for the message.
void set_allocator_settings(const std::string& settings, const char* source);

// The last text set_allocator_settings accepted ("" by default).
std::string allocator_settings();

// set_allocator_settings from PYTORCH_OPENREG_ALLOC_CONF, if set.
void load_allocator_config();

} // namespace openreg
