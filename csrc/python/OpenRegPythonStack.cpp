#include "python/OpenRegPythonStack.h"

#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>
// After the headers above: it defines Py_BUILD_CORE around CPython's own.
#include <torch/csrc/dynamo/cpython_includes.h>

#include <array>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>

// From torch/csrc/profiler/python/combined_traceback.h, which the wheel ships
// but cannot be included (it includes nlohmann/json.hpp, which it does not).
namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
TORCH_PYTHON_API void installCapturedTracebackPython();
} // namespace torch

namespace py = pybind11;

namespace openreg {
namespace {

// One Python frame: its code object and instruction, in bytes, as
// PyFrame_GetLasti gives it and PyCode_Addr2Line takes it.
struct Frame {
  PyCodeObject* code;
  int lasti;
  bool operator==(const Frame&) const = default;
};

struct FrameHash {
  size_t operator()(const Frame& f) const {
    return std::hash<const void*>()(f.code) * 31 + static_cast<size_t>(f.lasti);
  }
};

// Code objects whose last stack went. A stack goes wherever the allocator
// drops its last use (under the allocator's lock, in a thread without the
// GIL), where taking the GIL could deadlock, so their references are dropped
// the next time the GIL is held here: torch's CapturedTraceback defers its
// own the same way (torch/csrc/profiler/python/combined_traceback.cpp).
std::mutex& dead_codes_mutex() {
  static auto* mutex = new std::mutex(); // leaked: stacks of exiting threads go after static destructors
  return *mutex;
}
std::vector<PyCodeObject*>& dead_codes() {
  static auto* codes = new std::vector<PyCodeObject*>(); // leaked, as the mutex
  return *codes;
}

void release_dead_codes() { // with the GIL
  std::vector<PyCodeObject*> codes;
  {
    const std::lock_guard<std::mutex> lock(dead_codes_mutex());
    codes.swap(dead_codes());
  }
  for (PyCodeObject* code : codes) {
    Py_DECREF(code);
  }
}

// A Python stack, innermost frame first; it references its code objects, so
// that their addresses name them until it goes.
class PythonStack final : public c10::GatheredContext {
 public:
  PythonStack(std::vector<Frame> frames, size_t hash) : frames_(std::move(frames)), hash_(hash) {}
  ~PythonStack() override {
    if (!frames_.empty()) {
      const std::lock_guard<std::mutex> lock(dead_codes_mutex());
      for (const Frame& f : frames_) {
        dead_codes().push_back(f.code);
      }
    }
  }
  const std::vector<Frame>& frames() const {
    return frames_;
  }
  size_t hash() const {
    return hash_;
  }

 private:
  std::vector<Frame> frames_;
  size_t hash_;
};

// The frames of `thread`, the calling thread, into `out`; their hash. Read
// as python_launch_site (Module.cpp) reads the innermost one: the thread is
// inside this call, so its frames stay as they are and each holds its code
// object. The frames torch's walk (PyEval_GetFrame, PyFrame_GetBack) gives,
// without making a frame object of each.
size_t read_frames(PyThreadState* thread, std::vector<Frame>& out) {
  out.clear();
  size_t hash = 0;
#if PY_VERSION_HEX >= 0x030D0000
  _PyInterpreterFrame* frame = thread->current_frame;
#else
  _PyInterpreterFrame* frame = thread->cframe->current_frame;
#endif
  for (; frame != nullptr; frame = frame->previous) {
    if (_PyFrame_IsIncomplete(frame)) {
      continue;
    }
    PyCodeObject* code = F_CODE(frame);
    const auto offset =
        reinterpret_cast<const char*>(PREV_INSTR(frame)) - reinterpret_cast<const char*>(_PyCode_CODE(code));
    const Frame f{code, offset < 0 ? -1 : static_cast<int>(offset)};
    out.push_back(f);
    hash = hash * 1000003 ^ FrameHash()(f);
  }
  return hash;
}

// The stacks this thread gathered last, and the buffer it reads frames into.
// A loop's allocations and frees come from a few stacks, which this many
// covers; the oldest is replaced.
constexpr size_t kRecentStacks = 16;
struct RecentStacks {
  std::vector<Frame> frames;
  std::array<std::shared_ptr<PythonStack>, kRecentStacks> stacks;
  size_t next = 0;
};
thread_local RecentStacks recent;

// torch's CapturedTraceback walks Python frames once torch's walker is in.
void install_torch_python_traceback() {
  static const bool installed = [] {
    torch::installCapturedTracebackPython();
    return true;
  }();
  (void)installed;
}

} // namespace

std::shared_ptr<c10::GatheredContext> gather_python_stack() {
  if (C10_UNLIKELY(!torch::jit::currentCallstack().empty())) {
    install_torch_python_traceback();
    return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/false);
  }
  static const auto* no_frames = new std::shared_ptr<PythonStack>(std::make_shared<PythonStack>(std::vector<Frame>(), 0));
  PyThreadState* thread = Py_IsInitialized() ? PyGILState_GetThisThreadState() : nullptr;
  if (thread == nullptr) {
    return *no_frames; // a thread Python never ran on, or Python has gone (torch's canGather)
  }
  RecentStacks& r = recent;
  const size_t hash = read_frames(thread, r.frames);
  if (r.frames.empty()) {
    return *no_frames;
  }
  for (const auto& stack : r.stacks) {
    if (stack != nullptr && stack->hash() == hash && stack->frames() == r.frames) {
      return stack;
    }
  }
  {
    const py::gil_scoped_acquire gil;
    release_dead_codes();
    for (const Frame& f : r.frames) {
      Py_INCREF(f.code);
    }
  }
  auto stack = std::make_shared<PythonStack>(r.frames, hash);
  r.stacks[r.next] = stack;
  r.next = (r.next + 1) % kRecentStacks;
  return stack;
}

std::shared_ptr<c10::GatheredContext> gather_python_and_cpp_stack() {
  install_torch_python_traceback();
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/true);
}

std::vector<py::object> symbolize_stacks(const std::vector<const c10::GatheredContext*>& contexts) {
  release_dead_codes();
  // torch's tracebacks (C++ or TorchScript frames) in one batch, as torch does.
  std::vector<torch::CapturedTraceback*> tracebacks;
  for (const c10::GatheredContext* context : contexts) {
    if (auto* traceback = dynamic_cast<const torch::CapturedTraceback*>(context)) {
      tracebacks.push_back(const_cast<torch::CapturedTraceback*>(traceback));
    }
  }
  std::vector<py::object> traceback_frames;
  if (!tracebacks.empty()) {
    traceback_frames = torch::py_symbolize(tracebacks);
  }
  // Inductor's generated code names the frames it came from, as torch's
  // symbolizer adds them (PythonTraceback::appendSymbolized).
  py::object frames_for_code;
  const py::dict modules = py::module_::import("sys").attr("modules");
  if (modules.contains("torch._inductor.codecache")) {
    frames_for_code = modules["torch._inductor.codecache"].attr("PyCodeCache").attr("stack_frames_for_code");
  }
  const py::str name_s("name"), filename_s("filename"), line_s("line");
  std::unordered_map<Frame, std::vector<py::object>, FrameHash> symbolized; // one frame's dicts
  auto symbolize = [&](const Frame& f) -> const std::vector<py::object>& {
    auto [it, inserted] = symbolized.try_emplace(f);
    if (inserted) {
      const py::handle filename = f.code->co_filename;
      const int line = PyCode_Addr2Line(f.code, f.lasti);
      py::dict d;
      d[name_s] = py::handle(f.code->co_name);
      d[filename_s] = filename;
      d[line_s] = line;
      it->second.push_back(std::move(d));
      if (frames_for_code) {
        const py::object extra = frames_for_code(filename, line);
        if (!extra.is_none()) {
          for (const py::handle h : extra) {
            py::dict e;
            e[name_s] = h[name_s];
            e[filename_s] = h[filename_s];
            e[line_s] = h[line_s];
            it->second.push_back(std::move(e));
          }
        }
      }
    }
    return it->second;
  };
  std::vector<py::object> out;
  out.reserve(contexts.size());
  size_t next_traceback = 0;
  for (const c10::GatheredContext* context : contexts) {
    if (auto* stack = dynamic_cast<const PythonStack*>(context)) {
      py::list frames;
      for (const Frame& f : stack->frames()) {
        for (const py::object& d : symbolize(f)) {
          frames.append(d);
        }
      }
      out.push_back(std::move(frames));
    } else if (dynamic_cast<const torch::CapturedTraceback*>(context) != nullptr) {
      out.push_back(traceback_frames[next_traceback++]);
    } else {
      out.push_back(py::list());
    }
  }
  return out;
}

} // namespace openreg
