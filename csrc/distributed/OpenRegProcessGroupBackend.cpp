// The openreg backend of a ProcessGroupOpenRegGloo: a c10d::Backend whose
// collectives call the Python group's methods.
//
// Why: the group is a Python ProcessGroup (gloo on CPU aliases,
// docs/integration/distributed.md). C++ reaches its Python methods only through the methods
// torch's trampoline forwards (torch/csrc/distributed/c10d/PyProcessGroup.hpp:
// allreduce, broadcast, allgather, all_to_all_single, ...). Every other
// ProcessGroup method (reduce, gather, scatter, alltoall, _allgather_base,
// which _c10d_functional.all_gather_into_tensor_out calls, ...) goes through
// c10d's dispatcher ops, whose PrivateUse1 kernels (torch/csrc/distributed/
// c10d/Ops.cpp) call ProcessGroup::getBackend(PrivateUse1): without a backend
// registered for openreg, "No backend type associated with device type
// openreg". This is that backend. Its collectives take the GIL and call the
// group's Python method of the same collective, which hands gloo the CPU
// aliases; the Python Work that returns is wrapped as a C++ one.
#include "distributed/OpenRegProcessGroupBackend.h"

// ATen/core/Tensor.h is one of csrc/precompiled.h's headers: setup.py then
// compiles this unit with the precompiled header, which holds much of the
// ATen/ATen.h that Backend.hpp includes (docs/performance.md).
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <chrono>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace openreg {
namespace {

// Python objects held from C++ go wherever their holder's last reference
// goes: a gloo thread, or a static destructor after the interpreter is gone
// (c10d's registries hold groups). Taking the GIL there would abort, so past
// finalisation the reference is left to the process's exit.
bool python_is_running() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

void release(py::object& object) {
  if (!object) {
    return;
  }
  if (python_is_running()) {
    const py::gil_scoped_acquire gil;
    object = py::object();
  } else {
    object.release();
  }
}

// A Python Work (the group's _Work) as C++ sees it. Like torch's PyWorkHolder
// (PyProcessGroup.hpp), whose header would bring torch's JIT bindings: wait()
// and getFuture() go through the Work trampoline (PyWork) to the Python
// methods; the others c10d's Python binding of Work offers are asked of the
// Python object directly, since the trampoline forwards only those two.
class PythonWork final : public c10d::Work {
 public:
  explicit PythonWork(py::object work) : work_(work.cast<c10::intrusive_ptr<c10d::Work>>()), object_(std::move(work)) {}
  PythonWork(const PythonWork&) = delete;
  PythonWork& operator=(const PythonWork&) = delete;
  ~PythonWork() override {
    release(object_);
  }

  bool wait(std::chrono::milliseconds timeout) override {
    return work_->wait(timeout);
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return work_->getFuture();
  }

  bool isCompleted() override {
    const py::gil_scoped_acquire gil;
    return object_.attr("is_completed")().cast<bool>();
  }

  int sourceRank() const override {
    const py::gil_scoped_acquire gil;
    py::object rank = object_.attr("_source_rank")();
    TORCH_CHECK(!rank.is_none(), "sourceRank() is only available for a recv from any source, once it is done");
    return rank.cast<int>();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_; // object_'s C++ side (the trampoline)
  py::object object_;
};

// The Python methods the collectives below call. Each must be the group
// class's own: torch.distributed.ProcessGroup's would run c10d's dispatcher op
// for the openreg tensors, which would come back here, forever.
constexpr std::array<const char*, 19> kForwarded = {
    "broadcast", "allreduce", "allreduce_coalesced", "reduce", "allgather", "all_gather_single",
    "allgather_coalesced", "all_gather_single_coalesced", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_single_coalesced", "alltoall", "all_to_all_single",
    "send", "recv", "recv_anysource", "barrier"};

class PythonGroupBackend final : public c10d::Backend {
 public:
  PythonGroupBackend(py::handle group, int rank, int size, std::string name)
      : Backend(rank, size), group_(py::weakref(group)), name_(std::move(name)) {}
  PythonGroupBackend(const PythonGroupBackend&) = delete;
  PythonGroupBackend& operator=(const PythonGroupBackend&) = delete;
  ~PythonGroupBackend() override {
    release(group_);
  }

  const std::string getBackendName() const override {
    return name_;
  }

  // The timeout is gloo's, which the group registers for CPU tensors:
  // ProcessGroup::setTimeout sets it there.
  void setTimeout(std::chrono::milliseconds /*timeout*/) override {}

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts)
      override {
    return forward("broadcast", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts)
      override {
    return forward("allreduce", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    return forward("allreduce_coalesced", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return forward("reduce", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return forward("allgather", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::AllgatherOptions& opts) override {
    return forward("all_gather_single", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return forward("allgather_coalesced", output_lists, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return forward("all_gather_single_coalesced", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override {
    return forward("gather", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override {
    return forward("scatter", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return forward("reduce_scatter", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override {
    return forward("reduce_scatter_single", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return forward("reduce_scatter_single_coalesced", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts) override {
    return forward("all_to_all_single", output, input, output_split_sizes, input_split_sizes, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override {
    return forward("alltoall", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return forward("send", tensors, dst, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return forward("recv", tensors, src, tag);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return forward("recv_anysource", tensors, tag);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return forward("barrier", opts);
  }

 private:
  // The group's Python method `method` on `args` (tensors by reference: the
  // method writes into the caller's tensors).
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> forward(const char* method, const Args&... args) {
    const py::gil_scoped_acquire gil;
    py::object group = group_();
    TORCH_CHECK(!group.is_none(), name_, " ", method, ": the process group this backend belongs to is gone "
                "(destroy_process_group()); create a new group.");
    return c10::make_intrusive<PythonWork>(group.attr(method)(args...));
  }

  py::weakref group_;
  std::string name_;
};

} // namespace

py::object process_group_backend(py::handle group, int rank, int size, const std::string& name) {
  py::object base = py::module_::import("torch.distributed").attr("ProcessGroup");
  py::object cls = py::type::of(group);
  for (const char* method : kForwarded) {
    TORCH_CHECK(!cls.attr(method).is(base.attr(method)), name, ": ", py::str(cls).cast<std::string>(),
                " must define ", method, "(): torch.distributed.ProcessGroup's would call this backend again.");
  }
  c10::intrusive_ptr<c10d::Backend> backend = c10::make_intrusive<PythonGroupBackend>(group, rank, size, name);
  return py::cast(backend);
}

} // namespace openreg
