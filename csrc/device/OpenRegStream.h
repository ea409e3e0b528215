// c10::Stream <-> runtime stream, and the current stream of each thread.
//
// As for CUDA (c10/cuda/CUDAStream.h), a stream is named by a StreamId: 0 is
// the device's default stream; the others come from a fixed pool per device
// and priority, created on first use and handed out round-robin, so any
// number of torch.Stream objects map onto a bounded set of worker threads.
#pragma once

#include <cstdint>

#include <c10/core/Stream.h>

#include "runtime/OpenRegRuntime.h"

namespace openreg {

// The openreg stream `id` of `device` (0: the default stream).
c10::Stream make_stream(c10::DeviceIndex device, c10::StreamId id);
orStream_t raw_stream(const c10::Stream& stream);
c10::Stream current_stream(c10::DeviceIndex device);
// The id of current_stream(device) for a valid `device`, without checks.
c10::StreamId current_stream_id(c10::DeviceIndex device) noexcept;
c10::Stream default_stream(c10::DeviceIndex device);
// Makes `stream` current for its device on this thread; returns the previous one.
c10::Stream exchange_stream(const c10::Stream& stream);
c10::Stream stream_from_pool(c10::DeviceIndex device, int priority);
int stream_priority(const c10::Stream& stream);
void synchronize_stream(const c10::Stream& stream);

// The runtime stream current for `device` (valid) on this thread.
orStream_t current_raw_stream(c10::DeviceIndex device);

// For the code that touches the memory of `device` from the calling thread
// rather than from a kernel queued on the stream (launch_kernel,
// OpenRegLaunch.h): waits for the work queued on the current stream (an
// asynchronous kernel or copy writing its input, say) and reports a failed
// kernel. Two atomic loads when idle; nothing inside a kernel, which is
// already in stream order.
void join_current_stream(c10::DeviceIndex device);

// The wait of join_current_stream without marking kernel work for the
// profiler: for calls whose device work is a copy, which the runtime reports.
void wait_current_stream(c10::DeviceIndex device);
// Whether the current stream of `device` has nothing queued (a failure it
// holds is not reported); two loads while no stream has work.
bool current_stream_idle(c10::DeviceIndex device);
// Whether the current stream of `device` is being captured into a graph
// (OpenRegGraph.h): a launch is then recorded, never run; one relaxed load
// while no stream captures.
bool current_stream_capturing(c10::DeviceIndex device);

// torch.openreg.set_sync_debug_mode, as c10/cuda's SyncDebugMode: 0 off, 1
// warn, 2 error on every operation that makes the host wait for a stream
// where CUDA's would (a copy between the host and the device that is not
// non_blocking, .item(), an operator whose result's shape depends on the
// device's values, Stream.synchronize); synchronize() and
// Event.synchronize() are explicit and never reported, as on CUDA.
void set_sync_debug_mode(int mode);
int sync_debug_mode();
// Warns or raises, per the mode, naming `what`; no-op when off.
void check_sync_debug(const char* what);
// How many times the host has waited for the device through check_sync_debug's
// calls (copies with a host side, item(), Stream.synchronize): the pytest
// plugin's count of each test's host synchronisations.
uint64_t host_wait_count();

} // namespace openreg
