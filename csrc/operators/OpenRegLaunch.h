// Launching a kernel: host code queued on the current stream of a device
// (orLaunchKernel, docs/integration/streams.md), which runs it after the work queued
// before it while the caller goes on.
//
// What the kernel needs must be captured by value: it runs after the caller
// returned. A tensor is captured as kernel_argument(t), which, like a CUDA
// kernel's pointer argument, does not keep device memory alive: the caller
// may drop its tensors at once, and the caching allocator hands their blocks
// only to later work on the same stream (or, after record_stream, after the
// other streams' work), which the stream orders after this kernel.
// On the stream's worker the kernel sees the launching thread's intra-op
// thread count and runs below autograd (a kernel's own tensor calls, a cast
// say, are not recorded); a call inside a kernel that launches another
// kernel runs it at once (orLaunchKernel).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/TensorBase.h>
#include <c10/core/Scalar.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "operators/cpu/OpenRegCpuAlias.h"
#include "device/OpenRegException.h"
#include "device/OpenRegStream.h"
#include "operators/OpenRegTrace.h"

namespace openreg {

// A tensor over t's memory with t's geometry and dtype that owns nothing: its
// storage is a bare pointer. Over device memory (an openreg tensor, or a CPU
// alias at kernel addresses) only stream order keeps the bytes meaningful,
// as for a CUDA kernel; the view has no Python object, so a kernel's worker
// may drop it without the GIL.
at::Tensor kernel_view(const at::TensorBase& t);
// A CPU tensor over the kernel addresses of openreg tensor t's memory, owning
// nothing: a kernel running CPU code on device memory (a CPU alias a kernel
// may hold; CpuAliases' are for the calling thread).
at::Tensor kernel_cpu_view(const at::TensorBase& t);

// What kernel_view needs of a tensor, captured without touching its
// TensorImpl's reference count: a launch captures it in the calling thread,
// and the kernel's thread makes the view, so allocating and freeing the view
// both happen where the kernel runs.
struct KernelTensorMeta {
  void* data = nullptr; // the storage's data
  size_t nbytes = 0;
  c10::Device device = c10::Device(c10::kCPU);
  caffe2::TypeMeta dtype;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  bool conj = false;
  bool neg = false;
  bool defined = false;
};
KernelTensorMeta kernel_tensor_meta(const at::TensorBase& t);
at::Tensor kernel_view(const KernelTensorMeta& meta);
// kernel_view of `meta` over `storage`, another view's storage of the same
// memory (so that the two share it, as tensors of one storage do).
at::Tensor kernel_view(const KernelTensorMeta& meta, const c10::Storage& storage);
// kernel_tensor_meta of openreg tensor t, for a CPU view at kernel addresses.
KernelTensorMeta kernel_cpu_tensor_meta(const at::TensorBase& t);

// What a queued kernel keeps of one argument of its launch: a kernel_view of
// an openreg tensor, a copy of a CPU tensor (host memory is not stream
// ordered: a CPU scalar operand is often a temporary of the caller, and CUDA
// passes its value) unless it is a wrapped number, anything else by value.
at::Tensor kernel_tensor_argument(const at::TensorBase& t);
template <typename T>
constexpr bool is_array_ref = false;
template <typename T>
constexpr bool is_array_ref<c10::ArrayRef<T>> = true;
template <typename T>
auto kernel_argument(T&& value) {
  if constexpr (std::is_base_of_v<at::TensorBase, std::decay_t<T>>) {
    return kernel_tensor_argument(value);
  } else {
    static_assert(
        !is_array_ref<std::decay_t<T>>,
        "an ArrayRef borrows the caller's memory: copy it into a vector before the launch");
    return std::decay_t<T>(std::forward<T>(value));
  }
}
// Arguments that borrow the caller's memory are kept as owned values that
// convert back to the argument's type where the kernel passes them on.
inline std::vector<int64_t> kernel_argument(at::IntArrayRef value) {
  return value.vec();
}
inline std::string kernel_argument(c10::string_view value) {
  return std::string(value);
}
struct KernelOptionalIntArray {
  std::optional<std::vector<int64_t>> value;
  operator at::OptionalIntArrayRef() const {
    return value ? at::OptionalIntArrayRef(*value) : at::OptionalIntArrayRef();
  }
};
inline KernelOptionalIntArray kernel_argument(at::OptionalIntArrayRef value) {
  return {value ? std::optional<std::vector<int64_t>>(value->vec()) : std::nullopt};
}
struct KernelOptionalScalar {
  std::optional<at::Scalar> value;
  operator at::OptionalScalarRef() const {
    return value ? at::OptionalScalarRef(*value) : at::OptionalScalarRef();
  }
};
inline KernelOptionalScalar kernel_argument(at::OptionalScalarRef value) {
  return {value ? std::optional<at::Scalar>(value.get()) : std::nullopt};
}

namespace detail {

// Kernels this thread is running (a queued one on a stream's worker, or one
// the calling thread runs in its place in the stream): launches made while it
// is not 0 run at once.
inline thread_local int running_kernels = 0;

struct RunningKernel {
  RunningKernel() {
    ++running_kernels;
  }
  RunningKernel(const RunningKernel&) = delete;
  RunningKernel& operator=(const RunningKernel&) = delete;
  ~RunningKernel() {
    --running_kernels;
  }
};

// A kernel of `device` the calling thread runs itself, in stream order:
// RunningKernel, and seen by the runtime's utilization sampling (orMarkKernel).
struct RunningKernelHere : RunningKernel {
  explicit RunningKernelHere(c10::DeviceIndex device) {
    orMarkKernel(device);
  }
  ~RunningKernelHere() {
    orMarkKernel(-1);
  }
};

// Memory for queued kernels. The runtime releases a completed kernel in a
// thread that launches or synchronizes on its stream, as a rule the thread
// that launched it, so a small cache per thread of freed blocks, by size,
// serves most launches without malloc (an iterator's kernel is larger than
// glibc's per-thread cache takes).
void* allocate_kernel(size_t bytes);
void free_kernel(void* block, size_t bytes) noexcept;

// `message`, and where the kernel was launched if `site` is known.
std::string with_launch_site(const char* message, const char* site);

// Called by a stream's worker before each queued kernel: gives the worker's
// OpenMP team the launching thread's size, `threads`, and, if the team fills
// the process's CPUs, binds its threads one to a CPU (OpenRegLaunch.cpp says
// why).
void use_team(int threads);

// A kernel's body as the runtime runs it: below autograd (a kernel's own
// tensor calls, a cast say, are not recorded); a failure as the runtime's,
// without c10's C++ backtrace, saying where the kernel was launched.
template <typename Body>
void run_body(Body& body, const char* site) {
  const c10::impl::ExcludeDispatchKeyGuard below_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  try {
    body();
  } catch (const c10::Error& e) {
    throw std::runtime_error(with_launch_site(e.what_without_backtrace(), site));
  } catch (const std::exception& e) {
    throw std::runtime_error(with_launch_site(e.what(), site));
  }
}

template <typename Body>
struct QueuedKernel {
  Body body;
  int threads;
  const char* site; // launch_site() of the launch
  // While the profiler observes: what it records of the kernel's run.
  std::unique_ptr<trace::QueuedKernel> profiled;

  static void* operator new(size_t bytes) {
    return allocate_kernel(bytes);
  }
  static void operator delete(void* block, size_t bytes) noexcept {
    free_kernel(block, bytes);
  }

  static void run(void* self) {
    auto& kernel = *static_cast<QueuedKernel*>(self);
    use_team(kernel.threads);
    const RunningKernel running;
    if (C10_UNLIKELY(kernel.profiled != nullptr)) {
      kernel.profiled->start_ns = orActivityGetTimestamp();
      struct Ran {
        trace::QueuedKernel& kernel;
        ~Ran() {
          trace::queued_kernel_ran(kernel);
        }
      } ran{*kernel.profiled};
      run_body(kernel.body, kernel.site);
      return;
    }
    run_body(kernel.body, kernel.site);
  }

  static void release(void* self) {
    delete static_cast<QueuedKernel*>(self);
  }
};

} // namespace detail

// Where the calling thread launches a kernel from, for the error its failure
// raises at a later call: "file:line in function" of the innermost Python
// frame (static storage), or nullptr when the thread runs no Python code (an
// autograd thread) or nothing says. csrc/python installs the function
// (set_launch_site_function); the launch layer knows no Python.
using LaunchSiteFn = const char* (*)();
void set_launch_site_function(LaunchSiteFn fn);
namespace detail {
inline std::atomic<LaunchSiteFn> launch_site_fn{nullptr};
} // namespace detail
inline const char* launch_site() {
  const LaunchSiteFn fn = detail::launch_site_fn.load(std::memory_order_relaxed);
  return fn != nullptr ? fn() : nullptr;
}

// True where a launch must run at once: in a kernel, queued or run by the
// calling thread in stream order (run_kernel_inline, run_small_kernel_if_idle).
inline bool inside_kernel() {
  return detail::running_kernels > 0;
}

// Runs body() in the calling thread after the work queued on the current
// stream of `device`, so its errors raise here with their own type; kernels it
// launches run at once, keeping stream order.
template <typename F>
void run_kernel_inline(c10::DeviceIndex device, F&& body) {
  join_current_stream(device);
  const detail::RunningKernelHere running(device);
  body();
}

// Elements below which a kernel is small: run at once on an idle stream,
// where handing it to the worker would cost the launching thread more than
// running it (docs/integration/streams.md, "Kernels"). A larger kernel is queued even on
// an idle stream, so that it runs beside the host's next Python and launches:
// whole models gain more from that than an operator timed alone loses
// (docs/performance.md, "Measurements behind comments").
constexpr int64_t kSmallKernel = 1024;

// The runtime's launch switches (fixed when it starts, which a launch
// follows), read once into a global atomic: every launch reads them.
namespace detail {
enum LaunchSwitch : int { kLaunchBlocking = 1, kQueueAllKernels = 2, kDiscreteMemory = 4, kSwitchesRead = 8 };
inline std::atomic<int> launch_switches{0};
int read_launch_switches();
inline int switches() {
  const int read = launch_switches.load(std::memory_order_relaxed);
  return C10_LIKELY(read != 0) ? read : read_launch_switches();
}
} // namespace detail
inline bool launch_blocking() {
  return (detail::switches() & detail::kLaunchBlocking) != 0;
}
inline bool queue_all_kernels() {
  return (detail::switches() & detail::kQueueAllKernels) != 0;
}
// OPENREG_DISCRETE_MEMORY=1: openreg behaves as a device whose memory CPU code
// cannot address. The routes that run torch's CPU operator kernels (the
// fallbacks, cpu_kernels, structured_on_cpu_aliases) stage copies of their
// operands' storages to host memory and copy written ones back, as torch's
// at::native::cpu_fallback does for a real device; launched kernels keep
// running on device memory. docs/porting.md.
inline bool discrete_memory() {
  return (detail::switches() & detail::kDiscreteMemory) != 0;
}

// torch.use_deterministic_algorithms(True): CPU kernels read the flag as they
// run (index_copy's loop runs serially under it), and a queued kernel may run
// after the caller has turned it off again, so while it is on every kernel
// runs at once, in stream order.
bool deterministic_algorithms();

// Whether a kernel of `work` elements on `device` runs at once rather than
// queued: small, on an idle current stream, without OPENREG_QUEUE_ALL_KERNELS=1.
inline bool small_kernel_on_idle_stream(c10::DeviceIndex device, int64_t work) {
  return work < kSmallKernel && !queue_all_kernels() && current_stream_idle(device);
}

// Runs body() in the calling thread if `work` (elements) is small and the
// current stream of `device` has nothing queued, as a device that completes
// it before the launch returns would. Its error raises here, as CPU's kernel
// raises it: a kernel that runs at once has no later call to report it, and an
// argument error a kernel finds must raise at the call (docs/integration/streams.md, "When
// errors raise"). False, without running it, if it must be queued (or
// OPENREG_QUEUE_ALL_KERNELS=1).
template <typename F>
bool run_small_kernel_if_idle(c10::DeviceIndex device, int64_t work, F& body) {
  if (!small_kernel_on_idle_stream(device, work)) {
    return false;
  }
  if (C10_UNLIKELY(trace::observed(trace::kProfile))) {
    trace::stream_joined(device);
  }
  // Below autograd already: an operator's kernel launches it.
  const detail::RunningKernelHere running(device);
  body();
  return true;
}

// Queues the kernel make() returns on the current stream of `device`; `name`
// (a string literal) names it in the error a failure raises. The kernel is
// made where the queue keeps it (a large one, an iterator's, is not moved).
template <typename Make>
void launch_kernel_made(c10::DeviceIndex device, const char* name, Make&& make) {
  if (inside_kernel()) {
    make()();
    return;
  }
  const bool capturing = current_stream_capturing(device);
  if ((launch_blocking() || deterministic_algorithms()) && !capturing) {
    // OPENREG_LAUNCH_BLOCKING=1 (an error is raised by this call), or
    // deterministic mode (deterministic_algorithms).
    run_kernel_inline(device, make());
    return;
  }
  using Kernel = detail::QueuedKernel<decltype(make())>;
  auto* kernel = new Kernel{make(), at::get_num_threads(), launch_site(), nullptr};
  orStream_t stream = current_raw_stream(device);
  // A captured kernel runs at each replay; the profiler records its launch.
  if (C10_UNLIKELY(trace::observed(trace::kProfile)) && !capturing) {
    // The profiler records the kernel when it runs, not the launching call.
    uint64_t id = 0;
    OPENREG_CHECK(orStreamGetId(stream, &id));
    kernel->profiled = std::make_unique<trace::QueuedKernel>(trace::queued_kernel(device, id));
  }
  OPENREG_CHECK(orLaunchKernel(stream, &Kernel::run, kernel, &Kernel::release, name));
}

// Queues body() on the current stream of `device`, or runs it at once if
// its `work` (elements) is small and the stream idle (run_small_kernel_if_idle).
template <typename F>
void launch_kernel(c10::DeviceIndex device, const char* name, int64_t work, F&& body) {
  if (!inside_kernel() && !launch_blocking() && run_small_kernel_if_idle(device, work, body)) {
    return;
  }
  launch_kernel_made(device, name, [&]() -> std::decay_t<F> { return std::forward<F>(body); });
}

// Where the next host kernel launched by this thread goes
// (openreg_launch_host_kernel): Inductor's generated kernels, whose Python
// binding calls that function right after the wrapper's kernel_arguments
// (csrc/python) set this. `device` < 0 or `at_once`: run at once (CPU
// tensors among the kernel's arguments, whose memory is not stream-ordered;
// the caller joined the streams involved).
struct HostKernelLaunch {
  c10::DeviceIndex device = -1;
  bool at_once = true;
  int64_t work = 0; // elements, for run_small_kernel_if_idle
  const char* name = "inductor kernel"; // static storage
};
void set_next_host_kernel(const HostKernelLaunch& launch);

// Combinations of operand dtypes a kernel has run with once: CPU's kernels
// choose their loop by dtype (AT_DISPATCH) inside the kernel, where CUDA's
// choose on the host before launching, so "not implemented for 'UInt16'" must
// come from the call. The first launch of each combination runs at once in
// the launching thread, raising what CPU raises; later ones are queued.
// Lock-free open addressing over 1024 slots (the suite filled 64 for add); a
// full table queues everything.
class SeenDtypes {
 public:
  bool contains(uint64_t key) const {
    for (size_t i = 0, slot = start(key); i < kSlots; ++i, slot = (slot + 1) % kSlots) {
      const uint64_t value = slots_[slot].load(std::memory_order_acquire);
      if (value == key + 1) {
        return true;
      }
      if (value == 0) {
        return false;
      }
    }
    return true;
  }
  void insert(uint64_t key) {
    for (size_t i = 0, slot = start(key); i < kSlots; ++i, slot = (slot + 1) % kSlots) {
      uint64_t expected = 0;
      if (slots_[slot].compare_exchange_strong(expected, key + 1) || expected == key + 1) {
        return;
      }
    }
  }

 private:
  static constexpr size_t kSlots = 1024;
  static size_t start(uint64_t key) {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 54); // Fibonacci hashing: top 10 bits
  }
  std::array<std::atomic<uint64_t>, kSlots> slots_{};
};

// The dtypes of `tensors`, packed, for SeenDtypes (0xff for an undefined one).
template <size_t N>
uint64_t dtype_key(const std::array<const at::TensorBase*, N>& tensors) {
  static_assert(N < 8, "dtype_key packs at most 7 operands");
  uint64_t key = N;
  for (size_t i = 0; i < N; ++i) {
    const uint8_t dtype = tensors[i]->defined() ? static_cast<uint8_t>(tensors[i]->scalar_type()) : 0xff;
    key |= static_cast<uint64_t>(dtype) << (8 * (i + 1));
  }
  return key;
}

// The work of a kernel over `tensors` (elements, for run_small_kernel_if_idle):
// the largest operand's size.
template <size_t N>
int64_t largest_numel(const std::array<const at::TensorBase*, N>& tensors) {
  int64_t work = 0;
  for (const at::TensorBase* t : tensors) {
    work = std::max<int64_t>(work, t->defined() ? t->numel() : 0);
  }
  return work;
}

// The tensor operands of a queued kernel. The launch captures each tensor's
// metadata (a CPU tensor is copied, kernel_tensor_argument); the kernel makes
// views of them (kernel_view), one per distinct tensor and one storage per
// device storage, so that a tensor passed twice (an in-place call's self and
// output) is one tensor there and operands that share memory share a
// storage. With kCpu, the views are CPU tensors at kernel addresses, for CPU
// code; otherwise openreg tensors, whose memory the kernel reads at
// orKernelAddress.
template <size_t N, bool kCpu>
class KernelOperands {
 public:
  explicit KernelOperands(const std::array<const at::TensorBase*, N>& tensors) {
    for (size_t i = 0; i < N; ++i) {
      const at::TensorBase& t = *tensors[i];
      first_[i] = i;
      storage_of_[i] = i;
      for (size_t j = 0; j < i && t.defined(); ++j) {
        const at::TensorBase& other = *tensors[j];
        if (other.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          first_[i] = j;
          break;
        }
        if (other.defined() && storage_of_[i] == i && other.device() == t.device() &&
            other.storage().unsafeGetStorageImpl() == t.storage().unsafeGetStorageImpl()) {
          storage_of_[i] = j;
        }
      }
      if (first_[i] != i) {
        continue;
      }
      if (t.defined() && !t.device().is_privateuseone()) {
        cpu_[i] = kernel_tensor_argument(t);
        storage_of_[i] = i;
      } else {
        metas_[i] = kCpu ? kernel_cpu_tensor_meta(t) : kernel_tensor_meta(t);
      }
    }
  }

  // The operands, in the kernel.
  std::array<at::Tensor, N> tensors() const {
    std::array<at::Tensor, N> out;
    for (size_t i = 0; i < N; ++i) {
      if (first_[i] != i) {
        out[i] = out[first_[i]];
      } else if (cpu_[i].defined()) {
        out[i] = cpu_[i];
      } else if (storage_of_[i] != i) {
        out[i] = kernel_view(metas_[i], out[storage_of_[i]].storage());
      } else {
        out[i] = kernel_view(metas_[i]);
      }
    }
    return out;
  }

 private:
  std::array<KernelTensorMeta, N> metas_;
  std::array<at::Tensor, N> cpu_;
  std::array<size_t, N> first_{}; // the first operand that is the same tensor
  std::array<size_t, N> storage_of_{}; // the first operand on the same storage
};

namespace detail {
// Runs body(tensors). With kCpu, CPU code ran: it must not have replaced a
// tensor (through a const_cast) or moved its memory, or its result would be
// where the device tensor never sees it. openreg's own code keeps its
// operands.
template <bool kCpu, size_t N, typename Body>
void run_on_tensors(const char* name, std::array<at::Tensor, N>& tensors, Body& body) {
  if constexpr (!kCpu) {
    body(tensors);
    return;
  }
  std::array<const c10::TensorImpl*, N> made{};
  std::array<const void*, N> memory{};
  for (size_t i = 0; i < N; ++i) {
    made[i] = tensors[i].unsafeGetTensorImpl();
    memory[i] = tensors[i].defined() ? tensors[i].storage().data() : nullptr;
  }
  body(tensors);
  for (size_t i = 0; i < N; ++i) {
    TORCH_CHECK(
        tensors[i].unsafeGetTensorImpl() == made[i] && (memory[i] == nullptr || tensors[i].storage().data() == memory[i]),
        name, ": the CPU code replaced or moved operand ", i, ", so its result cannot reach the openreg tensor. "
        "This is an openreg bug: bind the operator under cpu_kernels instead.");
  }
}

// body(tensors) in the calling thread, in the current stream's order: with
// kCpu the openreg operands as recycled CPU aliases (CpuAliases), cheaper to
// make than kernel views; otherwise the operands themselves. Both borrowed:
// the array changes no reference count.
template <bool kCpu, size_t N, typename Body>
void run_here(const char* name, const std::array<const at::TensorBase*, N>& operands, Body& body) {
  using Borrow = c10::MaybeOwnedTraits<at::Tensor>;
  std::optional<CpuAliases<N>> aliases;
  if constexpr (kCpu) {
    aliases.emplace();
  }
  struct Borrowed {
    std::array<at::Tensor, N> tensors;
    std::array<const c10::TensorImpl*, N> lent{};
    ~Borrowed() {
      for (size_t i = 0; i < N; ++i) {
        if (tensors[i].unsafeGetTensorImpl() == lent[i]) {
          Borrow::destroyBorrow(tensors[i]); // otherwise replaced by one the array owns
        }
      }
    }
  } borrowed;
  for (size_t i = 0; i < N; ++i) {
    // Every operand is an at::Tensor (the launches take their addresses).
    const auto& t = static_cast<const at::Tensor&>(*operands[i]);
    borrowed.tensors[i] =
        Borrow::createBorrow(kCpu && t.defined() && t.device().is_privateuseone() ? aliases->get(t).first->alias : t);
    borrowed.lent[i] = borrowed.tensors[i].unsafeGetTensorImpl();
  }
  run_on_tensors<kCpu>(name, borrowed.tensors, body);
}

// How every launch of the kernels here decides where its kernel runs:
// here() at once inside a kernel; here() in the calling thread on the first
// launch of `key`'s combination of operand dtypes in `seen` (so CPU's dtype
// errors raise at the call) and with OPENREG_LAUNCH_BLOCKING=1; here() as a
// small kernel on an idle stream; otherwise the kernel make() returns,
// queued. While the stream is captured into a graph, always the latter
// (recorded): a dtype error then fails the replay.
template <typename Here, typename Make>
void run_or_launch(
    c10::DeviceIndex device, const char* name, int64_t work, SeenDtypes& seen, uint64_t key, Here& here, Make&& make) {
  if (inside_kernel()) {
    here();
    return;
  }
  if ((!seen.contains(key) || launch_blocking()) && !current_stream_capturing(device)) {
    run_kernel_inline(device, here);
    seen.insert(key);
    return;
  }
  if (run_small_kernel_if_idle(device, work, here)) {
    return;
  }
  launch_kernel_made(device, name, std::forward<Make>(make));
}

template <bool kCpu, size_t N, typename Body>
struct OperandsKernel {
  KernelOperands<N, kCpu> operands;
  Body body;
  const char* name;
  void operator()() {
    std::array<at::Tensor, N> tensors = operands.tensors();
    run_on_tensors<kCpu>(name, tensors, body);
  }
};

} // namespace detail

// How a kernel of launch_operands_kernel gets its tensor operands.
inline constexpr bool kCpuTensors = true; // CPU tensors at kernel addresses, for CPU code
inline constexpr bool kDeviceTensors = false; // openreg tensors, for openreg's own code

// Launches body(tensors) on the current stream of `device`: code over
// `tensors`, which body gets as CPU tensors at kernel addresses (kCpu, for
// CPU functions), or as openreg tensors whose memory it reads at
// orKernelAddress (openreg's own loops); what else body needs it captures by
// value (kernel_argument). Queued, the operands are views the kernel makes
// (KernelOperands); run at once, the caller's own tensors or recycled CPU
// aliases, borrowed. The largest operand decides whether it is small
// (run_small_kernel_if_idle). As for an iterator's kernel
// (launch_iterator_kernel), the first launch of each combination of operand
// dtypes in `seen` runs in the calling thread, so CPU's dtype errors raise at
// the call; so does every launch with OPENREG_LAUNCH_BLOCKING=1.
template <bool kCpu, size_t N, typename Body>
void launch_operands_kernel(
    c10::DeviceIndex device,
    const char* name,
    SeenDtypes& seen,
    const std::array<const at::TensorBase*, N>& tensors,
    Body&& body,
    uint64_t more_key = 0) {
  auto here = [&] { detail::run_here<kCpu>(name, tensors, body); };
  using Kernel = detail::OperandsKernel<kCpu, N, std::decay_t<Body>>;
  detail::run_or_launch(device, name, largest_numel(tensors), seen, dtype_key(tensors) ^ more_key, here, [&]() -> Kernel {
    return Kernel{KernelOperands<N, kCpu>(tensors), std::forward<Body>(body), name};
  });
}

// In a kernel of launch_operands_kernel<kDeviceTensors>: CPU tensors at the kernel addresses of
// its operands (one per distinct tensor, as KernelOperands makes them), for
// CPU code on a slower path.
template <size_t N>
std::array<at::Tensor, N> cpu_tensors_of(const std::array<at::Tensor, N>& tensors) {
  std::array<const at::TensorBase*, N> operands;
  for (size_t i = 0; i < N; ++i) {
    operands[i] = &tensors[i];
  }
  return KernelOperands<N, /*kCpu=*/true>(operands).tensors();
}

} // namespace openreg

// Launches run(closure), host code compiled outside openreg (an Inductor
// kernel's binding, torch_openreg/openreg/_inductor.py), as set by
// set_next_host_kernel: queued on the current stream of its device, or at
// once. release(closure) frees the closure after it ran. C linkage: the
// binding, built without torch's headers, gets its address from the
// environment (_OPENREG_LAUNCH_HOST_KERNEL).
extern "C" void openreg_launch_host_kernel(void (*run)(void*), void* closure, void (*release)(void*));
