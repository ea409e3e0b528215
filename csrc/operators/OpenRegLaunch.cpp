#include "operators/OpenRegLaunch.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/StringUtil.h>

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "device/OpenRegDevice.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {

namespace {

// `nbytes` at `data`, owning nothing: a DataPtr without a deleter or context,
// so nothing is freed with the storage.
c10::Storage unowned_storage(size_t nbytes, void* data, c10::Device device) {
  return c10::Storage(
      c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(data, device), /*allocator=*/nullptr, /*resizable=*/false);
}

} // namespace

KernelTensorMeta kernel_tensor_meta(const at::TensorBase& t) {
  KernelTensorMeta meta;
  if (!t.defined()) {
    return meta;
  }
  const c10::StorageImpl& memory = *t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  meta.data = const_cast<void*>(memory.data());
  meta.nbytes = memory.nbytes();
  meta.device = memory.device();
  meta.dtype = t.dtype();
  meta.sizes.assign(t.sizes().begin(), t.sizes().end());
  meta.strides.assign(t.strides().begin(), t.strides().end());
  meta.offset = t.storage_offset();
  meta.conj = t.is_conj();
  meta.neg = t.is_neg();
  meta.defined = true;
  return meta;
}

at::Tensor kernel_view(const KernelTensorMeta& meta) {
  if (!meta.defined) {
    return {};
  }
  return kernel_view(meta, unowned_storage(meta.nbytes, meta.data, meta.device));
}

at::Tensor kernel_view(const KernelTensorMeta& meta, const c10::Storage& storage) {
  // Over CPU memory: an operand's CPU alias, at kernel addresses.
  const c10::DispatchKey key = meta.device.is_cpu() ? c10::DispatchKey::CPU : c10::DispatchKey::PrivateUse1;
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(key), meta.dtype);
  view.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes, meta.strides, meta.offset);
  view._set_conj(meta.conj);
  view._set_neg(meta.neg);
  return view;
}

at::Tensor kernel_view(const at::TensorBase& t) {
  return kernel_view(kernel_tensor_meta(t));
}

KernelTensorMeta kernel_cpu_tensor_meta(const at::TensorBase& t) {
  KernelTensorMeta meta = kernel_tensor_meta(t);
  if (meta.defined) {
    TORCH_INTERNAL_ASSERT(t.device().is_privateuseone());
    meta.data = orKernelAddress(meta.data);
    meta.device = c10::Device(c10::kCPU);
  }
  return meta;
}

at::Tensor kernel_cpu_view(const at::TensorBase& t) {
  return kernel_view(kernel_cpu_tensor_meta(t));
}

int detail::read_launch_switches() {
  ensure_initialized(); // the runtime reads the switches when it starts
  const int read = kSwitchesRead | (orLaunchBlocking() ? kLaunchBlocking : 0) |
      (orQueueAllKernels() ? kQueueAllKernels : 0) | (orDiscreteMemory() ? kDiscreteMemory : 0);
  launch_switches.store(read, std::memory_order_relaxed); // racing threads store the same value
  return read;
}

bool deterministic_algorithms() {
  return at::globalContext().deterministicAlgorithms();
}

std::string detail::with_launch_site(const char* message, const char* site) {
  return site == nullptr ? std::string(message) : c10::str(message, "\n(the kernel was launched from ", site, ")");
}

void set_launch_site_function(LaunchSiteFn fn) {
  detail::launch_site_fn.store(fn, std::memory_order_relaxed);
}

namespace {
thread_local HostKernelLaunch next_host_kernel;

// A host kernel's closure, owned: released once, where the kernel is.
class HostKernel {
 public:
  HostKernel(void (*run)(void*), void* closure, void (*release)(void*))
      : run_(run), closure_(closure), release_(release) {}
  HostKernel(HostKernel&& other) noexcept
      : run_(other.run_), closure_(std::exchange(other.closure_, nullptr)), release_(other.release_) {}
  HostKernel(const HostKernel&) = delete;
  HostKernel& operator=(const HostKernel&) = delete;
  HostKernel& operator=(HostKernel&&) = delete;
  ~HostKernel() {
    if (closure_ != nullptr) {
      release_(closure_);
    }
  }
  void operator()() {
    run_(closure_);
  }

 private:
  void (*run_)(void*);
  void* closure_;
  void (*release_)(void*);
};
} // namespace

void set_next_host_kernel(const HostKernelLaunch& launch) {
  next_host_kernel = launch;
}

namespace detail {

namespace {

// Blocks of up to kClasses * kClassBytes bytes, kept by size class (a
// multiple of kClassBytes), at most kKept per class and thread.
constexpr size_t kClassBytes = 512;
constexpr size_t kClasses = 8;
constexpr size_t kKept = 64;

struct KernelBlocks {
  std::array<std::vector<void*>, kClasses> free;
  KernelBlocks() {
    for (auto& blocks : free) {
      blocks.reserve(kKept);
    }
  }
  ~KernelBlocks() {
    for (auto& blocks : free) {
      for (void* block : blocks) {
        ::operator delete(block);
      }
    }
  }
};

KernelBlocks& kernel_blocks() {
  thread_local KernelBlocks blocks;
  return blocks;
}

size_t size_class(size_t bytes) {
  return (bytes + kClassBytes - 1) / kClassBytes - 1;
}

} // namespace

void* allocate_kernel(size_t bytes) {
  if (const size_t c = size_class(bytes); c < kClasses) {
    std::vector<void*>& blocks = kernel_blocks().free[c];
    if (!blocks.empty()) {
      void* block = blocks.back();
      blocks.pop_back();
      return block;
    }
    return ::operator new((c + 1) * kClassBytes);
  }
  return ::operator new(bytes);
}

void free_kernel(void* block, size_t bytes) noexcept {
  if (const size_t c = size_class(bytes); c < kClasses) {
    std::vector<void*>& blocks = kernel_blocks().free[c];
    if (blocks.size() < kKept) {
      blocks.push_back(block); // reserved by KernelBlocks(): push_back does not allocate
      return;
    }
  }
  ::operator delete(block);
}

namespace {

// A worker's OpenMP team: the worker and its helper threads, which meet at
// every barrier of a kernel (MKL's GEMMs that split their reduction dimension
// spin until the partner's half is done). The simulated device runs them on
// the host's cores beside the launching thread. Left to the scheduler, which
// balances by load, two members of a team shared one core for seconds at a
// time while the host thread had the other to itself: a team whose threads
// sleep between kernels weighs no more than one busy host thread. Each
// barrier then waited for a thread that was not running, and GPT-2's forward
// went over CPU's time in those stretches. So the team is bound one thread to
// a CPU, like OMP_PROC_BIND=close; the launching thread stays free, and the
// scheduler puts it beside the least busy member. What this costs: a model
// whose host thread is the longer path (T5's forward) loses the lead the
// other placement gave it, a core of its own for the host (docs/performance.md,
// "What each design choice costs").
//
// Only a team that fills the process's CPUs is bound: that is when the host
// thread must share a core with one of its members. A smaller team is left
// free, and the scheduler has a core to spare for the host (a team of one,
// as in a torchrun job's ranks with OMP_NUM_THREADS=1, has nothing to wait
// for). Team k starts at the allowed CPU k + the process id, so that the
// workers of two streams, or of two processes (the ranks of a job on one
// machine), do not all sit on the first CPU. Where the user placed OpenMP's
// threads (OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY), libgomp keeps them
// where it put them.

// The CPUs the process may run on, read before the first team is bound.
const std::vector<int>& allowed_cpus() {
  static const std::vector<int> cpus = [] {
    std::vector<int> out;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) {
          out.push_back(cpu);
        }
      }
    }
    return out;
  }();
  return cpus;
}

bool placed_by_user() {
  static const bool placed = std::getenv("OMP_PROC_BIND") != nullptr || std::getenv("OMP_PLACES") != nullptr ||
      std::getenv("GOMP_CPU_AFFINITY") != nullptr;
  return placed;
}

// Binds the calling thread to `cpus` (to all of them: free again); a CPU that
// left the process's set meanwhile makes it fail, and the thread stays as it was.
void bind_self(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) {
    CPU_SET(cpu, &set);
  }
  sched_setaffinity(0, sizeof set, &set);
}

std::atomic<size_t> teams{0}; // teams bound so far: the next one's index
thread_local size_t team_index = SIZE_MAX; // this worker's, once bound
thread_local int team_size = 0; // the size this worker's team was placed for

void place_team(int threads) {
  const std::vector<int>& cpus = allowed_cpus();
  if (cpus.size() < 2 || placed_by_user()) {
    return;
  }
  if (static_cast<size_t>(threads) < cpus.size()) {
    bind_self(cpus); // free (again)
    return;
  }
  if (team_index == SIZE_MAX) {
    team_index = teams.fetch_add(1);
  }
  const size_t first = team_index + static_cast<size_t>(getpid());
  // libgomp gives a master thread's later parallel regions (ATen's, MKL's)
  // the same pool threads in the same order, so binding them once holds.
#pragma omp parallel num_threads(threads)
  bind_self({cpus[(first + omp_get_thread_num()) % cpus.size()]});
}

} // namespace

void use_team(int threads) {
  if (at::get_num_threads() != threads) {
    at::set_num_threads(threads);
  }
  if (threads != team_size) {
    team_size = threads;
    place_team(threads);
  }
}

} // namespace detail

at::Tensor kernel_tensor_argument(const at::TensorBase& t) {
  if (!t.defined() || t.device().is_privateuseone()) {
    return kernel_view(t);
  }
  // A wrapped number (a Python scalar ATen made a 0-dim tensor of) has no
  // other owner to write to it: holding it is as good as a copy.
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    return at::Tensor(t);
  }
  return at::Tensor(t).clone();
}

} // namespace openreg

extern "C" void openreg_launch_host_kernel(void (*run)(void*), void* closure, void (*release)(void*)) {
  const openreg::HostKernelLaunch launch = std::exchange(openreg::next_host_kernel, openreg::HostKernelLaunch{});
  openreg::HostKernel kernel(run, closure, release);
  if (launch.device < 0 || launch.at_once) {
    kernel();
    return;
  }
  openreg::launch_kernel(launch.device, launch.name, launch.work, std::move(kernel));
}
