// The simulated openreg driver API.
//
// This layer plays the role the CUDA driver/runtime plays for torch.cuda: device
// enumeration, the current device of a thread, device memory, streams, events
// and copies. It knows nothing of tensors, ATen or Python; everything above it
// (allocator, guard, hooks, kernels) talks to the "hardware" only through these
// functions.
//
// Device memory. Each device owns a fixed-size region of address space
// (OPENREG_DEVICE_MEMORY bytes). Device addresses, the ones orMalloc returns
// and torch stores in tensors, are mapped PROT_NONE: host code that
// dereferences one faults, and the fault handler installed by orInit ends the
// process naming openreg and the allocation. The bytes live in a second
// mapping at a fixed offset from the first; kernels (host code in this
// simulation) reach them through orKernelAddress. Translating costs one
// comparison and one addition, no system call, so native kernels keep CPU
// speed.
//
// Streams. Each stream is an in-order queue served by its own worker thread:
// kernels (orLaunchKernel), asynchronous copies, host functions and event
// records run there, in the order they were queued; the launching thread
// returns as soon as the work is queued.
#pragma once

#include <cstddef>
#include <cstdint>

namespace openreg {

enum class orError {
  Success = 0,
  InvalidDevice,        // device index outside [0, device count)
  InvalidValue,         // null pointer where one is required, bad kind, ...
  MemoryAllocation,     // the device (or host) has no room for the request
  InvalidPointer,       // the pointer is not (inside) a live openreg allocation
  InvalidConfiguration, // OPENREG_DEVICE_COUNT / OPENREG_DEVICE_MEMORY malformed
  NotReady,             // the stream or event still has work pending
  InvalidHandle,        // event without timing, event never recorded, ...
  LaunchFailure,        // a kernel queued earlier failed (orGetLaunchError says how)
  StreamCaptureUnsupported, // the call would wait for (or order against) a stream being captured
  StreamCaptureInvalidated, // the capture met a call it cannot record (StreamCaptureUnsupported)
  StreamCaptureUnmatched,   // no capture to end on the stream, or one already begun there
};

enum class orMemcpyKind { HostToHost, HostToDevice, DeviceToHost, DeviceToDevice };

struct orPointerAttributes {
  bool is_device = false;      // true when the pointer lies inside a device allocation
  bool is_pinned_host = false; // true when it lies inside page-locked host memory
  int device = -1;             // owning device, when is_device
  void* base = nullptr;        // start of the owning allocation
  size_t size = 0;             // size of the owning allocation in bytes
};

struct orDeviceProp {
  char name[64];
  size_t total_memory;
  int major; // "compute capability" of the simulated device
  int minor;
  int multi_processor_count; // host threads a kernel may use
};

// Largest device count OPENREG_DEVICE_COUNT may ask for.
constexpr int kMaxDevices = 16;
constexpr int kDefaultDeviceCount = 2;
// Device memory per device unless OPENREG_DEVICE_MEMORY says otherwise.
constexpr size_t kDefaultDeviceMemory = size_t{8} << 30;

const char* orGetErrorString(orError error);

// Reads OPENREG_DEVICE_COUNT and OPENREG_DEVICE_MEMORY and maps device memory,
// once. On InvalidConfiguration, `message` (if given) receives a sentence
// saying what was wrong and how to fix it.
orError orInit(const char** message = nullptr);
// (Re)installs the fault handler in front of any SIGSEGV handler installed
// after orInit; a no-op when it is already first.
orError orInstallFaultHandler();
orError orGetDeviceCount(int* count);
orError orGetDevice(int* device);
orError orSetDevice(int device);
orError orGetDeviceProperties(orDeviceProp* prop, int device);
// Free and total device memory of the current device.
orError orMemGetInfo(size_t* free, size_t* total);
// Waits for all work queued on every stream of `device`.
orError orDeviceSynchronize(int device);
// The percent of the last second (or of the time since the first call, if
// less) during which a kernel ran on `device` (kernels and host functions
// queued on its streams) and during which its memory was read or written
// (kernels and copies), as NVML's utilization rates. The first call starts a
// thread that samples the streams every millisecond, so it reports 0; it
// sees the kernels a thread runs itself in stream order through orMarkKernel.
orError orDeviceGetUtilization(int device, unsigned* kernel_percent, unsigned* memory_percent);
// Marks the calling thread as running a kernel of `device` in stream order
// itself (a launch that runs a small kernel at once), or as not (-1), for
// orDeviceGetUtilization: a store to a slot of the thread's own.
void orMarkKernel(int device) noexcept;

// Allocates `size` bytes on the current device. A zero-byte request yields
// nullptr. Like cudaMalloc this is slow (a lock and a search): callers cache.
orError orMalloc(void** ptr, size_t size);
// Like cudaFree, waits for the device's streams first.
orError orFree(void* ptr);
// Gives the host back the pages of [ptr, ptr + size), a range inside one live
// allocation, whose contents become zeros; the range stays allocated. For a
// caching allocator's free blocks: the simulated device's memory is the
// process's resident memory. The caller makes sure no queued work uses it.
orError orMemDiscard(void* ptr, size_t size);
// Page-locked ("pinned") host memory, the source and target of asynchronous copies.
orError orMallocHost(void** ptr, size_t size);
orError orFreeHost(void* ptr);
orError orPointerGetAttributes(orPointerAttributes* attributes, const void* ptr);

// The address at which a kernel reaches the device memory at `ptr`. Any other
// pointer (host memory) is returned unchanged, so translating twice is harmless.
void* orKernelAddress(void* ptr);
const void* orKernelAddress(const void* ptr);
// True when `ptr` is a device address (live or not), i.e. host code must not
// dereference it.
bool orIsDeviceAddress(const void* ptr);

// Synchronous copy. The device side(s) must be live device ranges.
orError orMemcpy(void* dst, const void* src, size_t count, orMemcpyKind kind);

// -- sharing device memory between processes (like cudaIpc*) ---------------------
//
// The kernel view of a process's device memory is a memfd mapped MAP_SHARED
// (docs/integration/ipc.md), so another
// process can map part of it. The handle names the page-aligned range of that
// file covering one allocation; the receiving process maps the range into a
// range of its own device heap on the same device index, so the pointer it
// gets is an ordinary device pointer of its own (PROT_NONE to host code,
// reached by kernels through orKernelAddress).

struct orIpcMemHandle {
  int fd = -1;          // the exporter's memory file; the runtime owns it (dup it to send it)
  int device = -1;      // device index of the allocation
  uint64_t offset = 0;  // page-aligned offset of the range in the file
  uint64_t size = 0;    // bytes of the range, a multiple of the page size
  uint64_t base = 0;    // where the allocation starts inside the range
  uint64_t process = 0; // pid of the exporter
  uint64_t memory = 0;  // identity of the exporter's device memory (differs across fork and exec)
};

// A handle for the live allocation containing `ptr`. For memory this process
// opened from another's handle, that handle (with this process's descriptor
// of the file): a third process then maps the producer's memory too. The
// exporter must keep the allocation (or its own opened mapping) alive while
// any process has the handle open: freeing an allocation gives its pages back
// in every process that mapped them.
orError orIpcGetMemHandle(orIpcMemHandle* handle, const void* ptr);
// Maps the handle's range on device `handle.device` of this process and sets
// `*ptr` to where the allocation starts. `handle.fd` must be valid in this
// process; the caller may close it afterwards (the mapping keeps the memory).
// The memory lives as long as any process maps it, the exporter's exit
// notwithstanding.
orError orIpcOpenMemHandle(void** ptr, const orIpcMemHandle& handle);
// Unmaps memory orIpcOpenMemHandle returned (after the device's streams are
// done with it) and gives the range back to this process's heap.
orError orIpcCloseMemHandle(void* ptr);

// -- streams and events -----------------------------------------------------------

struct orStream;
using orStream_t = orStream*;
struct orEvent;
using orEvent_t = orEvent*;

// Lower numbers are higher priorities, as in CUDA; a priority outside
// [greatest, least] is clamped.
orError orDeviceGetStreamPriorityRange(int* least, int* greatest);
// The default stream of `device`; it lives as long as the process.
orError orStreamGetDefault(orStream_t* stream, int device);
// A new stream on the current device. Streams are never destroyed: torch keeps
// stream handles in pools for the life of the process, as it does for CUDA.
orError orStreamCreateWithPriority(orStream_t* stream, int priority);
orError orStreamGetDevice(orStream_t stream, int* device);
orError orStreamGetPriority(orStream_t stream, int* priority);
// A number unique to the stream in this process, fixed for its life (like
// cudaStreamGetId); profilers name streams by it.
orError orStreamGetId(orStream_t stream, uint64_t* id);
// How many tasks (kernels, copies, host functions, event markers) have been
// queued on the stream since it was made; a kernel run at once
// by its caller (docs/integration/streams.md, "Kernels") is not one.
orError orStreamGetQueuedCount(orStream_t stream, uint64_t* count);
// Success when all work queued so far has finished, NotReady otherwise.
orError orStreamQuery(orStream_t stream);
// Whether all work queued so far has finished, without reporting a failure.
orError orStreamIsIdle(orStream_t stream, bool* idle);
// Success when every stream of every device has finished its queued work (so
// no per-stream query is needed), NotReady otherwise.
orError orStreamQueryAll();
orError orStreamSynchronize(orStream_t stream);
// Later work on `stream` waits until `event`'s last record has completed.
orError orStreamWaitEvent(orStream_t stream, orEvent_t event);
orError orMemcpyAsync(void* dst, const void* src, size_t count, orMemcpyKind kind, orStream_t stream);
// Runs fn(data) on the stream's worker after earlier work, like cudaLaunchHostFunc.
orError orLaunchHostFunc(orStream_t stream, void (*fn)(void*), void* data);

// -- kernels ----------------------------------------------------------------------
//
// A kernel is host code in this simulation, run by the stream's worker.
// orLaunchKernel queues kernel(args) after the work queued on `stream` so far
// and returns. Once the kernel ran, the worker calls release(args) (if
// given), so arguments must not own what only another thread may release.
// `name` (static storage) names the kernel in its error.
//
// A kernel fails by throwing. The stream keeps its first failure and the next
// synchronising call that waits for the stream reports it, once, as
// LaunchFailure: orStreamSynchronize, orEventSynchronize, orDeviceSynchronize
// and orStreamQuery. orGetLaunchError then gives the kernel's name and message.
// Later kernels still run: the device stays usable.
//
// A launch from inside a kernel (a kernel that calls other kernels) runs at
// once: the launching kernel is already in stream order. So does every launch
// when OPENREG_LAUNCH_BLOCKING=1 (read once by orInit), like
// CUDA_LAUNCH_BLOCKING: orLaunchKernel returns after the work queued before
// it and the kernel itself have run, with the kernel's failure (or an earlier
// one of the stream), so an error points at the call that caused it.
using orKernelFn = void (*)(void* args);
orError orLaunchKernel(orStream_t stream, orKernelFn kernel, void* args, orKernelFn release, const char* name);
// True on a stream's worker while it runs queued work.
bool orInsideKernel();
// Whether OPENREG_LAUNCH_BLOCKING=1 was set when the runtime started.
bool orLaunchBlocking();
// Whether OPENREG_QUEUE_ALL_KERNELS=1 was set when the runtime started: the
// ATen layer then queues every kernel, where it otherwise runs a small one on
// an idle stream at once.
bool orQueueAllKernels();
// Whether OPENREG_DISCRETE_MEMORY=1 was set when the runtime started: the
// device then behaves as one whose memory the host cannot address (a GPU
// without unified addressing); only kernels and orMemcpy reach it.
bool orDiscreteMemory();
// The failure the last LaunchFailure returned on this thread reported:
// "<kernel name>: <message>"; "" if none.
const char* orGetLaunchError();

enum orEventFlags : unsigned { orEventDefault = 0, orEventDisableTiming = 2 };
orError orEventCreateWithFlags(orEvent_t* event, unsigned flags);
orError orEventDestroy(orEvent_t event);
// Captures the work queued on `stream` so far; the event completes after it.
orError orEventRecord(orEvent_t event, orStream_t stream);
orError orEventQuery(orEvent_t event);
orError orEventSynchronize(orEvent_t event);
// Milliseconds between two completed events recorded with timing enabled.
orError orEventElapsedTime(float* ms, orEvent_t start, orEvent_t end);

// -- graphs ---------------------------------------------------------------------
//
// As CUDA's stream capture: between orStreamBeginCapture and
// orStreamEndCapture, what is launched on the stream (kernels, asynchronous
// copies, host functions) is recorded, not run, into a graph that
// orGraphLaunch then queues on any stream as often as asked. A node keeps its
// arguments until the graph is destroyed and the launches queued before are
// done (a kernel's release runs then, once), so a kernel must be able to run
// again with the same arguments.
//
// While a stream captures, a call that would wait for it or order against it
// cannot be recorded: orStreamSynchronize, orStreamQuery, orEventRecord and
// orStreamWaitEvent on it (the latter for an event not yet complete), and
// orDeviceSynchronize as the mode says. Such a call returns
// StreamCaptureUnsupported and invalidates the capture, whose end then
// returns StreamCaptureInvalidated, as CUDA's does. Only one stream takes
// part in a capture.
enum orStreamCaptureMode {
  // orDeviceSynchronize from any thread refuses while a stream of the device captures.
  orStreamCaptureModeGlobal = 0,
  // Only from the thread that began the capture.
  orStreamCaptureModeThreadLocal = 1,
  // Never: it waits for the device's other streams.
  orStreamCaptureModeRelaxed = 2,
};
struct orGraph;
using orGraph_t = orGraph*;
orError orStreamBeginCapture(orStream_t stream, orStreamCaptureMode mode);
// Ends the capture begun on `stream`; *graph receives what it recorded.
orError orStreamEndCapture(orStream_t stream, orGraph_t* graph);
orError orStreamIsCapturing(orStream_t stream, bool* capturing);
// Whether any stream of the process captures now (one relaxed load).
bool orStreamCaptureUnderway();
// Queues the graph's nodes on `stream`, after the work queued there and after
// the graph's previous launch (on whatever stream it was).
orError orGraphLaunch(orGraph_t graph, orStream_t stream);
// The nodes still queued run; their arguments are released after them.
orError orGraphDestroy(orGraph_t graph);
orError orGraphGetNodeCount(orGraph_t graph, size_t* count);
// Writes the graph's nodes, in order, as a Graphviz file (cudaGraphDebugDotPrint).
orError orGraphDebugDotPrint(orGraph_t graph, const char* path);

// -- activity records -----------------------------------------------------------
//
// What CUPTI's activity API is to CUDA: how a profiler learns what the device
// did and when. The only device work the runtime itself performs is copying
// (kernels are host code run by the layer above, which reports them itself),
// so the records describe copies: while a callback is set, every orMemcpy and
// orMemcpyAsync that moves bytes delivers one record once the bytes have moved,
// on the thread that moved them (a stream worker, for asynchronous copies).
// With no callback a copy pays one relaxed atomic load.
//
// Each thread has a stack of external correlation ids, as
// cuptiActivityPushExternalCorrelationId gives CUDA: a record carries the id
// on top of the issuing thread's stack when the copy was issued, so the
// profiler can tie the copy to the framework call that issued it.

struct orActivityMemcpy {
  orMemcpyKind kind;
  size_t bytes;
  int device;              // the device side's device (the destination's when both are)
  orStream_t stream;       // the stream it ran on; the device's default stream for orMemcpy
  uint64_t correlation_id; // 0 when the issuing thread's stack was empty
  int64_t start_ns;        // std::chrono::system_clock, nanoseconds since the Unix epoch
  int64_t end_ns;
};

using orActivityCallback = void (*)(const orActivityMemcpy& record);
// nullptr stops the records. A copy already under way may still report to the
// callback it saw when it was issued.
orError orActivitySetCallback(orActivityCallback callback);
orError orActivityPushExternalCorrelationId(uint64_t id);
// InvalidValue when this thread's stack is empty; `id` (if given) receives the popped id.
orError orActivityPopExternalCorrelationId(uint64_t* id = nullptr);
// The id on top of this thread's stack, 0 when it is empty.
uint64_t orActivityGetExternalCorrelationId();
// Now, on the clock of activity records (nanoseconds since the Unix epoch,
// std::chrono::system_clock), like cuptiGetTimestamp; layers above time the
// work they report with it.
int64_t orActivityGetTimestamp();

} // namespace openreg
