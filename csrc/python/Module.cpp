// torch_openreg._C: the thin Python surface over the ATen glue. Everything a
// user calls goes through torch_openreg.openreg (torch.openreg), not here.
// The Python side of torch that the bindings use, not torch/extension.h: that
// also brings the whole C++ frontend (torch/all.h), many seconds of parsing.
#include <ATen/EmptyTensor.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/dynamo/cpython_includes.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/python_numbers.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegAllocatorConfig.h"
#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"
#include "operators/OpenRegFallback.h"
#include "device/OpenRegGenerator.h"
#include "device/OpenRegGpuTrace.h"
#include "graphs/OpenRegGraph.h"
#include "memory/OpenRegHostAllocator.h"
#include "compiler/OpenRegInductorLaunch.h"
#include "ipc/OpenRegIpc.h"
#include "operators/OpenRegLaunch.h"
#include "operators/cpu/OpenRegCpuAlias.h"
#include "operators/OpenRegRoutes.h"
#include "device/OpenRegStream.h"
#include "operators/OpenRegTensorFormat.h"
#include "operators/OpenRegTrace.h"
#include "profiler/OpenRegActivityRecorder.h"
#include "distributed/OpenRegProcessGroupBackend.h"
#include "python/OpenRegPythonStack.h"
#include "runtime/OpenRegRuntime.h"

namespace {

// An OpenRegPluggableAllocator's two C functions, as Python hands over their
// addresses (torch_openreg/openreg/memory.py; 0: none).
openreg::PluggableAllocator pluggable_allocator(uintptr_t alloc, uintptr_t free) {
  return {
      reinterpret_cast<void* (*)(ssize_t, int, openreg::orStream_t)>(alloc),
      reinterpret_cast<void (*)(void*, ssize_t, int, openreg::orStream_t)>(free)};
}

// Memory history (torch.openreg.memory._record_memory_history, _snapshot):
// the allocator records the contexts of python/OpenRegPythonStack.h, the
// Python stack (and TorchScript's, and C++ frames with stacks="all").
void record_memory_history(
    const std::optional<std::string>& enabled,
    const std::optional<std::string>& context,
    const std::string& stacks,
    size_t max_entries,
    bool clear_history) {
  TORCH_CHECK_VALUE(
      !enabled || *enabled == "state" || *enabled == "all", "_record_memory_history: enabled must be None, "
      "'state' or 'all', got '", enabled.value_or(""), "'");
  TORCH_CHECK_VALUE(
      !context || *context == "state" || *context == "alloc" || *context == "all",
      "_record_memory_history: context must be None, 'state', 'alloc' or 'all', got '", context.value_or(""), "'");
  TORCH_CHECK_VALUE(
      stacks == "python" || stacks == "all", "_record_memory_history: stacks must be 'python' or 'all', got '",
      stacks, "'");
  openreg::MemoryHistory history;
  if (enabled) {
    history.trace = *enabled == "all";
    history.max_entries = max_entries;
    if (context) {
      history.block_context = true;
      // Event contexts only where there is a trace to hold them.
      history.alloc_context = history.trace && *context != "state";
      history.free_context = history.trace && *context == "all";
      history.gather = stacks == "all" ? &openreg::gather_python_and_cpp_stack : &openreg::gather_python_stack;
    }
  }
  openreg::record_memory_history(history, clear_history);
}

const char* trace_action_name(openreg::TraceAction action) {
  switch (action) {
    case openreg::TraceAction::kAlloc:
      return "alloc";
    case openreg::TraceAction::kFreeRequested:
      return "free_requested";
    case openreg::TraceAction::kFreeCompleted:
      return "free_completed";
    case openreg::TraceAction::kSegmentAlloc:
      return "segment_alloc";
    case openreg::TraceAction::kSegmentFree:
      return "segment_free";
    case openreg::TraceAction::kOom:
      return "oom";
    case openreg::TraceAction::kSnapshot:
      return "snapshot";
  }
  return "unknown";
}

// The pinned host allocator's statistics, nested as torch.cuda's
// host_memory_stats_as_nested_dict lays them out.
py::dict host_memory_stats() {
  const at::HostStats stats = openreg::pinned_host_allocator()->get_stats();
  const auto stat = [](const c10::CachingAllocator::Stat& s) {
    py::dict d;
    d["current"] = s.current;
    d["peak"] = s.peak;
    d["allocated"] = s.allocated;
    d["freed"] = s.freed;
    return d;
  };
  const auto duration = [](const c10::CachingAllocator::DurationStat& s) {
    py::dict d;
    d["total"] = s.total;
    d["max"] = s.max;
    d["min"] = s.min;
    d["count"] = s.count;
    d["avg"] = s.count != 0 ? s.total / s.count : 0;
    return d;
  };
  py::dict out;
  out["num_host_alloc"] = stats.num_host_alloc;
  out["num_host_free"] = stats.num_host_free;
  out["allocations"] = stat(stats.allocations);
  out["allocated_bytes"] = stat(stats.allocated_bytes);
  out["active_requests"] = stat(stats.active_requests);
  out["active_bytes"] = stat(stats.active_bytes);
  out["host_alloc_time"] = duration(stats.host_alloc_time);
  out["host_free_time"] = duration(stats.host_free_time);
  return out;
}

// The snapshot as torch.cuda.memory._snapshot() lays it out, so that
// torch.cuda._memory_viz and PyTorch's memory viewer read it.
py::dict memory_snapshot() {
  openreg::MemorySnapshot snapshot;
  {
    const py::gil_scoped_release no_gil; // the allocator's lock is taken without the GIL
    snapshot = openreg::memory_snapshot();
  }
  // Every context symbolized once, in one batch.
  std::vector<const c10::GatheredContext*> contexts;
  for (const auto& segment : snapshot.segments) {
    for (const auto& block : segment.blocks) {
      contexts.push_back(block.context.get());
    }
  }
  for (const auto& trace : snapshot.device_traces) {
    for (const auto& entry : trace) {
      contexts.push_back(entry.context.get());
    }
  }
  std::sort(contexts.begin(), contexts.end());
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());
  const std::vector<py::object> symbolized = openreg::symbolize_stacks(contexts);
  auto frames = [&](const std::shared_ptr<c10::GatheredContext>& context) -> py::object {
    if (context == nullptr) {
      return py::list();
    }
    const auto it = std::lower_bound(contexts.begin(), contexts.end(), context.get());
    return symbolized[static_cast<size_t>(it - contexts.begin())];
  };
  py::list segments;
  for (const auto& segment : snapshot.segments) {
    py::dict s;
    s["device"] = segment.device;
    s["address"] = segment.address;
    s["total_size"] = segment.total_size;
    s["allocated_size"] = segment.allocated_size;
    s["active_size"] = segment.active_size;
    s["requested_size"] = segment.requested_size;
    s["stream"] = segment.stream;
    s["segment_type"] = segment.large ? "large" : "small";
    s["segment_pool_id"] = py::make_tuple(0, segment.mempool);
    s["is_expandable"] = false;
    s["frames"] = py::list();
    py::list blocks;
    for (const auto& block : segment.blocks) {
      py::dict b;
      b["address"] = block.address;
      b["size"] = block.size;
      b["requested_size"] = block.requested;
      b["state"] = block.state;
      b["frames"] = frames(block.context);
      blocks.append(b);
    }
    s["blocks"] = blocks;
    segments.append(s);
  }
  py::list device_traces;
  for (const auto& trace : snapshot.device_traces) {
    py::list entries;
    for (const auto& entry : trace) {
      py::dict e;
      e["action"] = trace_action_name(entry.action);
      e["addr"] = entry.addr;
      e["size"] = entry.size;
      e["stream"] = entry.stream;
      e["time_us"] = entry.time_us;
      e["frames"] = frames(entry.context);
      if (entry.action == openreg::TraceAction::kOom) {
        e["device_free"] = entry.device_free;
      }
      entries.append(e);
    }
    device_traces.append(entries);
  }
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = device_traces;
  return out;
}

py::object default_generator(c10::DeviceIndex index) {
  return py::reinterpret_steal<py::object>(
      THPGenerator_initDefaultGenerator(openreg::default_generator(index)));
}

py::dict device_properties(int index) {
  openreg::check_device_index(static_cast<c10::DeviceIndex>(index));
  openreg::orDeviceProp prop{};
  OPENREG_CHECK(openreg::orGetDeviceProperties(&prop, index));
  py::dict d;
  d["name"] = std::string(prop.name);
  d["total_memory"] = prop.total_memory;
  d["major"] = prop.major;
  d["minor"] = prop.minor;
  d["multi_processor_count"] = prop.multi_processor_count;
  return d;
}

// Keeps the current stream busy for `ms` milliseconds without blocking the
// caller, like torch.cuda._sleep: tests use it to observe asynchrony.
void sleep_on_current_stream(double ms) {
  const c10::Stream stream = openreg::current_stream(openreg::current_device());
  auto* duration = new std::chrono::duration<double, std::milli>(ms);
  OPENREG_CHECK(openreg::orLaunchHostFunc(
      openreg::raw_stream(stream),
      [](void* data) {
        auto* d = static_cast<std::chrono::duration<double, std::milli>*>(data);
        std::this_thread::sleep_for(*d);
        delete d;
      },
      duration));
}

// torch.Event.elapsed_time rejects subclasses of torch.Event as its argument
// on this torch version, so torch.openreg.Event measures through here.
double event_elapsed_time(py::handle start, py::handle end) {
  for (py::handle e : {start, end}) {
    TORCH_CHECK_TYPE(
        PyObject_IsInstance(e.ptr(), reinterpret_cast<PyObject*>(&THPEventType)) == 1,
        "elapsed_time expects torch.Event objects, got ", py::str(py::type::of(e)).cast<std::string>());
  }
  return reinterpret_cast<THPEvent*>(start.ptr())->event.elapsedTime(reinterpret_cast<THPEvent*>(end.ptr())->event);
}

constexpr std::pair<const char*, openreg::FallbackMode> kFallbackModes[] = {
    {"silent", openreg::FallbackMode::Silent},
    {"warn", openreg::FallbackMode::Warn},
    {"error", openreg::FallbackMode::Error},
};

void set_fallback_mode(const std::string& name) {
  for (const auto& [mode_name, mode] : kFallbackModes) {
    if (name == mode_name) {
      openreg::set_fallback_mode(mode);
      return;
    }
  }
  TORCH_CHECK_VALUE(false, "unknown fallback mode '", name, "': use 'silent', 'warn' or 'error'");
}

std::string fallback_mode() {
  for (const auto& [mode_name, mode] : kFallbackModes) {
    if (openreg::fallback_mode() == mode) {
      return mode_name;
    }
  }
  TORCH_INTERNAL_ASSERT(false, "fallback mode without a name");
}

// (name, route, detail) for each operator and stub backend_functions.yaml binds.
std::vector<std::tuple<std::string, openreg::Route, std::string>> bindings() {
  std::vector<std::tuple<std::string, openreg::Route, std::string>> rows;
  for (const openreg::Binding& b : openreg::route_table().bindings) {
    rows.emplace_back(b.name, b.route, b.detail);
  }
  return rows;
}

// `args` with each openreg tensor replaced by its CPU alias (others pass
// through), seen(t) called for each openreg tensor; and whether a defined
// tensor of another device was among the others.
template <typename Seen>
std::pair<py::list, bool> with_cpu_aliases(const py::sequence& args, Seen&& seen) {
  py::list out;
  bool other_tensors = false;
  for (py::handle arg : args) {
    if (THPVariable_Check(arg.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(arg.ptr());
      if (t.defined() && t.is_privateuseone()) {
        seen(t);
        out.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(openreg::cpu_alias(t))));
        continue;
      }
      other_tensors = other_tensors || t.defined();
    }
    out.append(arg);
  }
  return {std::move(out), other_tensors};
}

// CPU tensors over the same bytes as openreg tensors, for CPU code that
// works on device memory in place: the distributed backend hands them to
// gloo. Each device's current stream is joined first, so work queued before
// is complete and what the caller does next is ordered like a kernel on that
// stream. Other arguments (CPU tensors, numbers) pass through unchanged.
py::list cpu_aliases(const py::sequence& args) {
  std::vector<c10::DeviceIndex> joined;
  return with_cpu_aliases(args, [&](const at::Tensor& t) {
    const c10::DeviceIndex device = t.device().index();
    if (std::find(joined.begin(), joined.end(), device) == joined.end()) {
      openreg::join_current_stream(device);
      joined.push_back(device);
    }
  }).first;
}

// The arguments of an Inductor C++ kernel of an openreg graph (the call the
// generated wrapper makes, torch_openreg/openreg/_inductor.py): each openreg
// tensor replaced by its CPU alias, from which the kernel's Python binding
// reads the pointers it passes, and where to launch the kernel, for the
// binding's call of openreg_launch_host_kernel that follows in this thread:
// queued on the current stream of the tensors' device (the largest tensor's
// size as its work), or, if the kernel also takes CPU tensors (host memory is
// not stream-ordered) or tensors of two devices, at once after joining their
// streams, as _host_aliases does. `name` names the kernel in errors and
// profiles.
py::list kernel_arguments(const std::string& name, const py::sequence& args) {
  static auto* names = new std::unordered_set<std::string>(); // leaked; the GIL guards it
  openreg::HostKernelOperands operands(names->insert(name).first->c_str());
  auto [out, host_tensors] = with_cpu_aliases(args, [&](const at::Tensor& t) { operands.add(t); });
  operands.launch(host_tensors);
  return out;
}

// Inductor's allocation call in generated wrappers, the openreg counterpart of
// the empty_strided_cpu / empty_strided_cuda it emits for those devices
// (torch/csrc/dynamo/guards.cpp): sizes and strides as tuples of ints, a
// torch.dtype and a device index (-1: the current device), straight to the
// allocator, without torch.empty_strided's argument parser and dispatch, which
// cost a compiled graph's wrapper time on every buffer.
PyObject* empty_strided_fast(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject* py_size = nullptr;
  PyObject* py_stride = nullptr;
  PyObject* py_dtype = nullptr;
  int index = -1;
  if (!PyArg_ParseTuple(args, "O!O!O!i", &PyTuple_Type, &py_size, &PyTuple_Type, &py_stride, &THPDtypeType,
                        &py_dtype, &index)) {
    return nullptr;
  }
  auto ints = [](PyObject* tuple) {
    c10::SmallVector<int64_t, 6> out(PyTuple_GET_SIZE(tuple));
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = THPUtils_unpackLong(PyTuple_GET_ITEM(tuple, i));
    }
    return out;
  };
  const auto size = ints(py_size);
  const auto stride = ints(py_stride);
  std::optional<c10::DeviceGuard> guard;
  if (index >= 0) {
    openreg::validate_device_index(static_cast<c10::DeviceIndex>(index));
    guard.emplace(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
  }
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  return THPVariable_Wrap(at::detail::empty_strided_generic(
      size, stride, openreg::device_allocator(), keys, reinterpret_cast<THPDtype*>(py_dtype)->scalar_type));
  END_HANDLE_TH_ERRORS
}

PyMethodDef kEmptyStrided = {"_empty_strided", empty_strided_fast, METH_VARARGS,
                             "_empty_strided(size, stride, dtype, index): an uninitialised openreg tensor "
                             "(Inductor's generated wrappers)."};

// torch's and torch_openreg's directories, with a trailing separator: set
// when the module loads (a static initialised on a launch could run Python,
// which lets another launching thread take the GIL and wait on the static).
std::vector<std::string>& package_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

struct LaunchFrame {
  std::string name; // "file:line in function"
  bool internal; // in torch's or torch_openreg's package
};

// The frame's entry, named on its first lookup; nullptr past kMaxSites or if
// Python cannot name it.
const LaunchFrame* launch_frame(_PyInterpreterFrame* frame) {
  PyCodeObject* code = F_CODE(frame);
  const int offset = static_cast<int>(
      reinterpret_cast<const char*>(PREV_INSTR(frame)) - reinterpret_cast<const char*>(_PyCode_CODE(code)));
  const std::pair<PyCodeObject*, int> key(code, offset);
  struct Hash {
    size_t operator()(const std::pair<PyCodeObject*, int>& k) const {
      return std::hash<const void*>()(k.first) * 31 + static_cast<size_t>(k.second);
    }
  };
  constexpr size_t kMaxSites = 1 << 16;
  static std::mutex mutex;
  static auto* frames = new std::unordered_map<std::pair<PyCodeObject*, int>, LaunchFrame, Hash>(); // leaked
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = frames->find(key);
    if (found != frames->end()) {
      return &found->second; // never erased: stays valid
    }
    if (frames->size() >= kMaxSites) {
      return nullptr;
    }
  }
  LaunchFrame named;
  {
    const pybind11::gil_scoped_acquire gil;
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    const char* function = PyUnicode_AsUTF8(code->co_qualname);
    if (file == nullptr || function == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    named.name = c10::str(file, ":", PyCode_Addr2Line(code, offset), " in ", function);
    const std::string_view path(file);
    named.internal = std::any_of(package_dirs().begin(), package_dirs().end(), [&](const std::string& dir) {
      return path.substr(0, dir.size()) == dir;
    });
    Py_INCREF(code); // the table's: the address names this code object only
  }
  const std::lock_guard<std::mutex> lock(mutex);
  const auto [entry, added] = frames->emplace(key, std::move(named));
  if (!added) {
    const pybind11::gil_scoped_acquire gil; // another thread named it meanwhile
    Py_DECREF(code);
  }
  return &entry->second;
}

// The launch site of a queued kernel (openreg::launch_site): the innermost
// Python frame of the launching thread outside torch and torch_openreg,
// "file:line in function". Those two packages' frames are skipped (torch's
// Python operators, a TorchDispatchMode's __torch_dispatch__ and _ops.py under
// the sanitizer) so that the site is the user's line, as the last line of a
// traceback would be. torch's bindings release the GIL around an operator, and
// taking it again on every launch would wait for whichever thread runs Python,
// so the frames are read from the thread's own state, as torch's dynamo reads
// frames (cpython_includes.h): the thread is inside this call, so its frames
// stay as they are and each holds its code object. Frames are kept by (code
// object, instruction); the first launch from one takes the GIL once to name
// it and tell whether it is in those packages, and references the code object,
// so that its address is not reused. A launch from the user's code looks up
// one frame. A thread without Python frames (autograd's) has no site. A
// program has few sites; past kMaxSites new ones go unnamed rather than grow
// the table.
const char* python_launch_site() {
  PyThreadState* thread = PyGILState_GetThisThreadState();
  if (thread == nullptr) {
    return nullptr; // a thread Python never ran on
  }
#if PY_VERSION_HEX >= 0x030D0000
  _PyInterpreterFrame* frame = thread->current_frame;
#else
  _PyInterpreterFrame* frame = thread->cframe->current_frame;
#endif
  const LaunchFrame* innermost = nullptr;
  for (; frame != nullptr; frame = frame->previous) {
    if (_PyFrame_IsIncomplete(frame)) {
      continue;
    }
    const LaunchFrame* named = launch_frame(frame);
    if (named == nullptr) {
      return innermost == nullptr ? nullptr : innermost->name.c_str();
    }
    if (!named->internal) {
      return named->name.c_str();
    }
    innermost = innermost == nullptr ? named : innermost;
  }
  // Only torch's own frames: torch's code launched it (a thread it started).
  return innermost == nullptr ? nullptr : innermost->name.c_str();
}

} // namespace

PYBIND11_MODULE(_C, m) {
  // Before anything can run an openreg operator: CpuKernelCall relies on it.
  openreg::install_cpu_allocator_redirect();
  openreg::gpu_trace::python_error_pending() = [] { return PyGILState_Check() != 0 && PyErr_Occurred() != nullptr; };
  {
    const auto os = pybind11::module_::import("os");
    const auto modules = pybind11::module_::import("sys").attr("modules"); // torch_openreg is importing this
    for (const char* package : {"torch", "torch_openreg"}) {
      const auto file = modules[package].attr("__file__");
      package_dirs().push_back(os.attr("path").attr("dirname")(file).cast<std::string>() +
                               os.attr("sep").cast<std::string>());
    }
  }
  openreg::set_launch_site_function(&python_launch_site);
  m.doc() = "Bindings of the openreg PrivateUse1 backend (use torch.openreg instead).";
  m.def("_init", &openreg::ensure_initialized, "Validates the configuration; raises on a bad one.");
  m.def("_check_config", [] {
    const char* message = nullptr;
    TORCH_CHECK(openreg::orInit(&message) == openreg::orError::Success, message);
  }, "Raises on a malformed OPENREG_DEVICE_COUNT / OPENREG_DEVICE_MEMORY without initialising.");
  m.def("_is_initialized", &openreg::is_initialized);
  m.def("_is_in_bad_fork", &openreg::in_forked_child);
  m.def("_device_count", [] { return static_cast<int>(openreg::device_count()); });
  m.def("_get_device", [] { return static_cast<int>(openreg::peek_current_device()); },
        "The current device of this thread; does not initialise openreg.");
  m.def("_set_device", [](int index) { openreg::set_device(static_cast<c10::DeviceIndex>(index)); });
  // Without the GIL while it waits, as torch.cuda.synchronize: a queued
  // kernel may run Python (a CPU kernel registered from Python).
  m.def("_synchronize", [](int index) { openreg::synchronize(static_cast<c10::DeviceIndex>(index)); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_validate_device_index", [](int index) {
    openreg::validate_device_index(static_cast<c10::DeviceIndex>(index));
  }, "RuntimeError naming the valid range unless the index is in it; does not initialise openreg.");
  m.def("_get_device_properties", &device_properties);
  m.def("_stream_priority", [](int64_t stream_id, int device_index) {
    return openreg::stream_priority(openreg::make_stream(static_cast<c10::DeviceIndex>(device_index), stream_id));
  });
  // The number the GPU trace names a stream by (OpenRegGpuTrace.h), for the
  // sanitizer to name the stream an operator runs on the same way.
  m.def("_stream_handle", [](int64_t stream_id, int device_index) {
    return reinterpret_cast<uintptr_t>(
        openreg::raw_stream(openreg::make_stream(static_cast<c10::DeviceIndex>(device_index), stream_id)));
  });
  m.def("_stream_queued_count", [](int64_t stream_id, int device_index) {
    uint64_t count = 0;
    OPENREG_CHECK(openreg::orStreamGetQueuedCount(
        openreg::raw_stream(openreg::make_stream(static_cast<c10::DeviceIndex>(device_index), stream_id)), &count));
    return count;
  }, "Tasks queued on the stream so far (orStreamGetQueuedCount).");
  m.def("_set_gpu_trace", [](bool on) { openreg::gpu_trace::reporting().store(on); }, "Reports streams, events and memory to torch's GPU trace (OpenRegGpuTrace.h), for the sanitizer.");
  m.def("_current_stream_id", [](int device_index) {
    return openreg::current_stream(static_cast<c10::DeviceIndex>(device_index)).id();
  });
  // (device, stream id) of the stream the caching allocator hands device
  // memory at `ptr` out on when this thread allocates it: the current stream
  // of the pointer's device (OpenRegAllocator.cpp, allocate_on).
  m.def("_allocation_stream", [](uintptr_t ptr) {
    openreg::orPointerAttributes attributes;
    OPENREG_CHECK(openreg::orPointerGetAttributes(&attributes, reinterpret_cast<const void*>(ptr)));
    TORCH_CHECK(attributes.is_device, "_allocation_stream: ", ptr, " is no openreg device address");
    const auto device = static_cast<c10::DeviceIndex>(attributes.device);
    return std::make_pair(static_cast<int>(device), openreg::current_stream(device).id());
  });
  m.def("_stream_priority_range", [] {
    int least = 0;
    int greatest = 0;
    OPENREG_CHECK(openreg::orDeviceGetStreamPriorityRange(&least, &greatest));
    return std::make_pair(least, greatest);
  });
  m.def("_event_elapsed_time", &event_elapsed_time);
  m.def("_record_memory_history", &record_memory_history);
  m.def("_memory_snapshot", &memory_snapshot);
  m.def("_set_memory_fraction", [](double fraction, int index) {
    openreg::set_memory_fraction(static_cast<c10::DeviceIndex>(index), fraction);
  });
  m.def("_get_memory_fraction", [](int index) { return openreg::get_memory_fraction(static_cast<c10::DeviceIndex>(index)); });
  m.def("_set_allocator_settings", [](const std::string& settings) {
    openreg::set_allocator_settings(settings, "_set_allocator_settings");
  });
  m.def("_get_allocator_settings", &openreg::allocator_settings);
  m.def("_caching_allocator_alloc", [](size_t nbytes, int index, int64_t stream_id) {
    return reinterpret_cast<uintptr_t>(
        openreg::raw_alloc(static_cast<c10::DeviceIndex>(index), nbytes, static_cast<c10::StreamId>(stream_id)));
  });
  m.def("_caching_allocator_delete", [](uintptr_t ptr) { openreg::raw_delete(reinterpret_cast<void*>(ptr)); });
  m.def("_mem_pool_create", [](int index, uintptr_t alloc, uintptr_t free, bool use_on_oom, bool no_split) {
    openreg::MempoolOptions options;
    options.allocator = pluggable_allocator(alloc, free);
    options.use_on_oom = use_on_oom;
    options.no_split = no_split;
    return openreg::create_mempool(static_cast<c10::DeviceIndex>(index), options);
  });
  m.def("_mem_pool_begin", [](int index, uint64_t id) {
    openreg::begin_allocate_to_pool(static_cast<c10::DeviceIndex>(index), id);
  });
  m.def("_mem_pool_end", [](int index, uint64_t id) {
    openreg::end_allocate_to_pool(static_cast<c10::DeviceIndex>(index), id);
  });
  m.def("_mem_pool_release", [](int index, uint64_t id) {
    openreg::release_mempool(static_cast<c10::DeviceIndex>(index), id);
  });
  m.def("_mem_pool_use_count", [](int index, uint64_t id) {
    return openreg::mempool_use_count(static_cast<c10::DeviceIndex>(index), id);
  });
  m.def("_graph_pool_handle", [] { return py::make_tuple(0, openreg::new_mempool_id()); });
  m.def("_register_graph_impl", &openreg::register_graph_impl);
  m.def("_is_current_stream_capturing", [](int index) {
    return openreg::orStreamCaptureUnderway() &&
        openreg::current_stream_capturing(
            index < 0 ? openreg::current_device() : static_cast<c10::DeviceIndex>(index));
  }, py::arg("device") = -1);
  m.def("_host_memory_stats", &host_memory_stats);
  m.def("_reset_accumulated_host_memory_stats", [] { openreg::pinned_host_allocator()->reset_accumulated_stats(); });
  m.def("_reset_peak_host_memory_stats", [] { openreg::pinned_host_allocator()->reset_peak_stats(); });
  m.def("_utilization", [](int index) {
    unsigned kernel = 0;
    unsigned memory = 0;
    OPENREG_CHECK(openreg::orDeviceGetUtilization(index, &kernel, &memory));
    return std::make_pair(kernel, memory);
  }, "(kernel, memory) busy percents of the last second (orDeviceGetUtilization).");
  m.def("_set_sync_debug_mode", &openreg::set_sync_debug_mode);
  m.def("_get_sync_debug_mode", &openreg::sync_debug_mode);
  m.def("_sync_count", &openreg::host_wait_count);
  m.def("_sleep", &sleep_on_current_stream, "Queues a wait of `ms` milliseconds on the current stream.");
  m.def("_install_fault_handler", [] { OPENREG_CHECK(openreg::orInstallFaultHandler()); },
        "Puts openreg's device-memory fault report in front of SIGSEGV handlers installed since.");
  m.def("_set_fallback_mode", &set_fallback_mode);
  m.def("_get_fallback_mode", &fallback_mode);
  m.def("_fallback_stats", [] {
    py::dict d;
    for (const auto& [name, count] : openreg::fallback_stats()) {
      d[py::str(name)] = count;
    }
    return d;
  });
  m.def("_reset_fallback_stats", &openreg::reset_fallback_stats);
  m.def("_set_dispatch_trace", [](bool on) { openreg::trace::set_observer(openreg::trace::kPrint, on); });
  m.def("_is_dispatch_trace_enabled", [] { return openreg::trace::observed(openreg::trace::kPrint); });
  // torch_openreg._C.Route, its members named as in the yaml (Route.structured_impl).
  py::enum_<openreg::Route> route(m, "Route");
  for (int i = 0; i < openreg::kRouteCount; ++i) {
    const auto r = static_cast<openreg::Route>(i);
    route.value(openreg::route_name(r), r);
  }
  m.def("_bindings", &bindings);
  m.def("_global_fallback", [] { return openreg::route_table().global_fallback; });
  m.def("_nested_fallback", [] { return openreg::route_table().nested_fallback; });
  m.def("_sparse_fallback", [] { return openreg::route_table().sparse_fallback; });
  m.def("_profiler_is_recording", &openreg::profiler::is_recording,
        "Whether a profiler session has openreg's kernel or copy observers installed.");
  m.def("_profiler_buffered_activities", &openreg::profiler::buffered_activities,
        "Device activities recorded and not yet handed to a profiler session.");
  m.def("_process_group_backend", &openreg::process_group_backend, py::arg("group"), py::arg("rank"), py::arg("size"),
        py::arg("name"), "The c10d backend for openreg tensors of a Python process group: its collectives call the "
        "group's methods (distributed/OpenRegProcessGroupBackend.h).");
  m.def("_host_aliases", &cpu_aliases,
        "CPU tensors aliasing the memory of the openreg tensors among the arguments (others pass through).");
  m.def("_kernel_arguments", &kernel_arguments,
        "The arguments of an Inductor kernel, openreg tensors as CPU aliases, and where the kernel launches.");
  m.def("_launch_host_kernel_address", [] { return reinterpret_cast<uintptr_t>(&openreg_launch_host_kernel); },
        "The address of openreg_launch_host_kernel, for Inductor kernels' bindings.");
  m.def("_inductor_function_address",
        [] { return reinterpret_cast<uintptr_t>(&openreg_inductor_function); },
        "The address of openreg_inductor_function, for Inductor's C++ wrapper.");
  m.add_object("_empty_strided", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kEmptyStrided, nullptr, m.ptr())));
  // Sharing storages between processes (torch_openreg/openreg/ipc.py).
  py::class_<openreg::ipc::SentStorage, std::shared_ptr<openreg::ipc::SentStorage>>(m, "_IpcSentStorage")
      .def_property_readonly("fd", [](const openreg::ipc::SentStorage& s) { return s.handle().fd; })
      .def_property_readonly("device", [](const openreg::ipc::SentStorage& s) { return s.handle().device; })
      .def_property_readonly("offset", [](const openreg::ipc::SentStorage& s) { return s.handle().offset; })
      .def_property_readonly("size", [](const openreg::ipc::SentStorage& s) { return s.handle().size; })
      .def_property_readonly("base", [](const openreg::ipc::SentStorage& s) { return s.handle().base; })
      .def_property_readonly("process", [](const openreg::ipc::SentStorage& s) { return s.handle().process; })
      .def_property_readonly("memory", [](const openreg::ipc::SentStorage& s) { return s.handle().memory; })
      .def_property_readonly("storage_offset", &openreg::ipc::SentStorage::storage_offset)
      .def_property_readonly("nbytes", &openreg::ipc::SentStorage::nbytes)
      .def_property_readonly("counter_fd", &openreg::ipc::SentStorage::counter_file)
      .def("close_counter_fd", &openreg::ipc::SentStorage::close_counter_file)
      .def("released", &openreg::ipc::SentStorage::released);
  m.def("_ipc_export", [](py::handle storage) {
    TORCH_CHECK(THPStorage_Check(storage.ptr()), "_ipc_export expects a torch.UntypedStorage");
    return std::make_shared<openreg::ipc::SentStorage>(THPStorage_Unpack(storage.ptr()));
  });
  m.def("_ipc_open", [](int fd, int device, uint64_t offset, uint64_t size, uint64_t base, uint64_t process,
                        uint64_t memory, uint64_t storage_offset, uint64_t nbytes, int counter_fd) {
    openreg::orIpcMemHandle handle;
    handle.fd = fd;
    handle.device = device;
    handle.offset = offset;
    handle.size = size;
    handle.base = base;
    handle.process = process;
    handle.memory = memory;
    return py::reinterpret_steal<py::object>(
        THPStorage_Wrap(openreg::ipc::open_storage(handle, storage_offset, nbytes, counter_fd)));
  });
  m.def("_ipc_release_send", &openreg::ipc::release_send);
  m.def("_default_generator", [](int index) { return default_generator(static_cast<c10::DeviceIndex>(index)); });

  // The format tag (docs/integration/device.md): torch.save / torch.load and
  // torch._utils.get/set_tensor_metadata reach it through this registry.
  torch::jit::TensorBackendMetaRegistry(
      c10::DeviceType::PrivateUse1, &openreg::serialize_tensor_format, &openreg::deserialize_tensor_format);
  m.def("_caching_allocator_enable", &openreg::set_caching_allocator_enabled);
  m.def("_caching_allocator_is_enabled", &openreg::caching_allocator_enabled);
  m.def("_change_current_allocator", [](uintptr_t alloc, uintptr_t free) {
    openreg::change_current_allocator(pluggable_allocator(alloc, free));
  });
  m.def("_tensor_format", &openreg::tensor_format);
  m.def("_set_tensor_format", &openreg::set_tensor_format);
}
