// One call of a CPU kernel on CPU aliases of openreg operands.
//
// The simulated device's memory is the process's memory, so torch's CPU kernel
// of an operator can run on it directly: each openreg operand is replaced by a
// CPU alias (OpenRegCpuAlias.h), the CPU kernel runs, and its results come back as
// openreg tensors without a copy. Two users:
// - the wrappers that backend_functions.yaml's `cpu_kernels` section generates
//   (unboxed: the codegen knows every argument's type);
// - the boxed CPU fallback (OpenRegFallback.cpp) for every other operator,
//   and its nested counterpart for nested tensors of the strided layout.
//
// A sparse openreg operand's CPU alias is a sparse CPU tensor of its layout
// whose indices and values are CPU aliases of its own; a sparse CPU result
// comes back as a sparse openreg tensor over the device memory of its
// converted members, and a written sparse operand takes the members the
// kernel gave its alias.
//
// A nested openreg operand's CPU alias is a NestedTensorCPU tensor with its
// nested sizes, strides and offsets over the same bytes; a nested CPU result
// comes back as a nested openreg tensor (its metadata tensors in CPU memory,
// as torch keeps them for every device). A Device argument naming the CPU
// (`.cpu()` of a nested tensor: _to_copy(device="cpu") on the fallback) keeps
// fresh results on the CPU.
//
// A call runs in three steps:
//   1. note() each argument: where the call runs, and a clear error for
//      operands on two devices, CPU operands where CUDA would refuse them, or a
//      generator of the wrong device;
//   2. begin(): a device guard, the kernel ordered after the current stream's
//      work, and CPU allocations redirected to the device's memory until
//      finish(), so fresh results are already device memory;
//   3. alias() / written() / device() / generator() give the CPU kernel its
//      arguments; after it ran, finish() updates the written operands (an out=
//      the CPU kernel resized) and result() turns each result into an openreg
//      tensor: an operand itself, a view of an operand's memory, or fresh
//      device memory adopted as it is.
#pragma once

#include <array>
#include <initializer_list>
#include <list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/List.h>
#include <ATen/core/operator_name.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>

#include "operators/cpu/OpenRegCpuAlias.h"
#include "operators/OpenRegLaunch.h"

namespace openreg {

// CPU aliases of a tensor list for one kernel call, borrowed from the
// CpuKernelCall that owns them (no reference counting to pass them).
class CpuAliasList {
 public:
  CpuAliasList() = default;
  CpuAliasList(CpuAliasList&& other) noexcept = default;
  CpuAliasList(const CpuAliasList&) = delete;
  CpuAliasList& operator=(const CpuAliasList&) = delete;
  CpuAliasList& operator=(CpuAliasList&&) = delete;
  ~CpuAliasList() {
    for (at::Tensor& t : tensors_) {
      c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
    }
  }
  void reserve(size_t n) {
    tensors_.reserve(n);
  }
  void push_back(const at::Tensor& t) {
    tensors_.push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
  }
  operator c10::ArrayRef<at::Tensor>() const {
    return tensors_;
  }

 private:
  std::vector<at::Tensor> tensors_;
};

// The error CpuKernelCall raises for operands on two devices (of one argument, a
// list, when the names are equal), for kernels that check their operands
// themselves.
[[noreturn]] void raise_two_devices(
    const std::string& op,
    c10::Device first,
    const char* first_argument,
    c10::Device second,
    const char* second_argument);

class CpuKernelCall {
 public:
  // `op` names the operator in error messages ("aten::mm"); CPU tensors of any
  // shape are accepted only when `accepts_cpu_tensors` (indices for indexing,
  // as on CUDA), otherwise only 0-dim ones that are not written.
  explicit CpuKernelCall(const char* op, bool accepts_cpu_tensors = false);
  CpuKernelCall(const c10::OperatorName& op, bool accepts_cpu_tensors);
  CpuKernelCall(const CpuKernelCall&) = delete;
  CpuKernelCall& operator=(const CpuKernelCall&) = delete;
  ~CpuKernelCall();

  // Step 1.
  void note(const at::Tensor& t, const char* argument, bool written = false);
  void note(const std::optional<at::Tensor>& t, const char* argument);
  void note(at::ITensorListRef tensors, const char* argument);
  void note(const c10::List<std::optional<at::Tensor>>& tensors, const char* argument);
  void note(const std::optional<at::Device>& device, const char* argument);
  void note(const std::optional<at::Generator>& generator, const char* argument);

  // Before step 2: fresh results stay CPU tensors (made from CPU memory), as
  // for a Device argument naming the CPU.
  void keep_results_on_cpu() {
    cpu_results_ = true;
  }

  // Before step 2: run on the memory as it is, without waiting for the
  // stream: a call that only learns its results' shapes while the stream is
  // captured into a graph, whose recorded work has not run (values are
  // stale, shapes are not).
  void run_without_waiting() {
    wait_ = false;
  }

  // After step 1: whether the kernel may be queued (OpenRegBoxedCpuKernel.h)
  // rather than run here: on an openreg device, outside a kernel, without
  // OPENREG_LAUNCH_BLOCKING=1, and not a small kernel (fewer than
  // kSmallKernel elements in every operand) on an idle stream, which runs at
  // once as launch_kernel runs one. While the stream is captured into a
  // graph: on an openreg device, outside a kernel, always.
  bool may_queue() const;

  // Step 2.
  void begin();
  // begin()'s checks of the noted arguments alone, for a kernel launched
  // rather than run here (launch_out_kernel).
  void check() const;

  // Step 3: the CPU kernel's arguments. alias()'s references and lists stay
  // valid until the CpuKernelCall ends.
  const at::Tensor& alias(const at::Tensor& t);
  at::Tensor written(const at::Tensor& t);
  std::optional<at::Tensor> alias(const std::optional<at::Tensor>& t);
  CpuAliasList alias(at::ITensorListRef tensors);
  const c10::List<std::optional<at::Tensor>>& alias(const c10::List<std::optional<at::Tensor>>& tensors);
  c10::Storage alias(const c10::Storage& storage);
  std::optional<at::Device> device(const std::optional<at::Device>& device) const;
  // The openreg generator's CPU generator; with none given, the device's
  // default generator (CPU kernels would otherwise draw from CPU's).
  std::optional<at::Generator> generator(const std::optional<at::Generator>& generator) const;

  // After the kernel.
  void finish();
  at::Tensor result(const at::Tensor& t);
  at::Tensor result(at::Tensor&& t);
  std::vector<at::Tensor> result(const std::vector<at::Tensor>& tensors);

  // The openreg device the call runs on, if any operand or argument names one.
  const std::optional<c10::Device>& where() const {
    return device_;
  }

  // After step 1: whether a CPU tensor other than a 0-dim operand that is not
  // written was noted (which only an `accepts_cpu_tensors` call takes).
  bool takes_cpu_tensors() const {
    return cpu_argument_ != nullptr;
  }

 private:
  // A result's fresh memory, for later results on the same memory: the
  // result's own storage, adopted as device storage (kept alive by the result,
  // which the caller holds), or, for memory that had to be copied, a new
  // device storage owned here.
  struct Fresh {
    c10::StorageImpl* device_storage_impl;
    c10::StorageImpl* cpu_storage_impl;
    c10::Storage device_storage; // a copied result's
  };
  struct Written {
    c10::MaybeOwned<at::Tensor> device_tensor;
    at::Tensor alias;
  };

  // An operand's CPU alias (CpuAliases), and the operand, borrowed when the
  // caller's reference outlives the call (keep()).
  using Operands = CpuAliases<6, c10::MaybeOwned<at::Tensor>>;
  using Operand = Operands::Entry;

  std::string op_name() const;
  void note_device(c10::Device device, const char* argument);
  const at::Tensor& alias(const at::Tensor& t, bool borrow);
  // For result(): an openreg tensor for the CPU kernel's `t`, or nothing when
  // `t` itself is the answer (not a CPU tensor, or adopted in place).
  std::optional<at::Tensor> converted(const at::Tensor& t);
  // converted() for a nested tensor of the strided layout.
  at::Tensor converted_nested(const at::Tensor& t);
  // alias(), converted() and write_back() for sparse layouts.
  const at::Tensor& sparse_alias(const at::Tensor& t, bool borrow);
  at::Tensor converted_sparse(const at::Tensor& t);
  void write_back_sparse(const Written& w);
  c10::Storage fresh_device_storage(c10::StorageImpl* cpu, std::optional<c10::DataPtr> device_memory);
  // An operand of the caller's: borrowed when the caller's reference outlives
  // the call (an unboxed wrapper's arguments), which spares reference counting
  // on tensors that Python also holds (each count change from 1 to 2 and back
  // goes through the Python object).
  c10::MaybeOwned<at::Tensor> keep(const at::Tensor& t, bool borrow) const {
    return borrow ? c10::MaybeOwned<at::Tensor>::borrowed(t) : c10::MaybeOwned<at::Tensor>::owned(std::in_place, t);
  }
  void write_back(const Written& w);
  // Staged (discrete_memory()): copies the host copy `host` of
  // `device_storage` back, once per call and storage.
  void copy_back(c10::StorageImpl* device_storage, const c10::Storage& host);

  const char* op_ = nullptr;
  const c10::OperatorName* op_name_ = nullptr; // instead of op_ (the fallback)
  const bool accepts_cpu_tensors_;
  // The fallback replaces its stack's tensors by their aliases, so CpuKernelCall
  // owns its operands there; generated wrappers' arguments outlive the call.
  const bool borrows_operands_;
  std::optional<c10::Device> device_;
  const char* device_argument_ = nullptr;
  const char* cpu_argument_ = nullptr;
  int64_t work_ = 0; // the largest openreg operand's elements
  // A Device argument names the CPU (`.cpu()` of a nested tensor is
  // _to_copy(device="cpu") on the fallback): fresh results stay CPU tensors.
  bool cpu_results_ = false;
  bool openreg_generator_ = false;
  bool other_generator_ = false;
  std::optional<c10::DeviceGuard> guard_;
  // alias()'s lists of optional tensors: the first is this thread's spare list
  // when no other call on the thread uses it (making a c10::List allocates it
  // and copies its element type, a shared_ptr), the others are made here.
  struct SpareList* spare_list_ = nullptr;
  std::list<c10::List<std::optional<at::Tensor>>> more_lists_;
  bool redirecting_ = false;
  bool marked_ = false; // the kernel runs here: orMarkKernel(device) was called
  bool wait_ = true; // begin() joins the current stream
  c10::DeviceIndex previous_redirect_ = -1;
  c10::SmallVector<Fresh, 2> fresh_;
  c10::SmallVector<Written, 2> written_;
  // One alias per operand, so an operand passed twice (self and out= of an
  // in-place op) is one tensor for the CPU kernel too, and a result that is
  // an operand itself returns as that operand. alias() returns references to
  // them: they never move.
  Operands operands_; // host copies under discrete_memory() (operands_.staged())
  c10::SmallVector<c10::StorageImpl*, 2> copied_back_;
  // Sparse operands and their sparse CPU aliases (whose members are among
  // operands_), in a list since alias() returns references to them.
  struct SparseOperand {
    c10::MaybeOwned<at::Tensor> device_tensor;
    at::Tensor alias;
  };
  std::list<SparseOperand> sparse_operands_;
};

// An input of an out= kernel (run_cpu_out_kernel, launch_out_kernel), with its
// name in errors.
using NamedInput = std::pair<const at::Tensor*, const char*>;

// CPU's out= kernel in the calling thread, on CPU aliases, after the current
// stream's work: for an `out` the kernel may resize, or an error CPU raises
// from the operands' layout that must raise at the call. `kernel(out_alias,
// call)` gets the alias of `out` and reaches the aliases of `inputs` through
// call.alias(); the inputs are checked as CpuKernelCall checks them.
template <typename Kernel>
void run_cpu_out_kernel(
    const char* op,
    std::initializer_list<NamedInput> inputs,
    const at::Tensor& out,
    Kernel&& kernel) {
  CpuKernelCall call(op);
  for (const auto& [tensor, name] : inputs) {
    call.note(*tensor, name);
  }
  call.note(out, "out", /*written=*/true);
  call.begin();
  at::Tensor out_alias = call.written(out);
  kernel(out_alias, call);
  call.finish();
}

// launch_out_kernel's checks of its operands, also for an openreg impl() with
// nothing to launch (an empty result), which checks them first as CUDA's do.
template <size_t N>
void check_out_operands(const char* op, const NamedInput (&inputs)[N], const at::Tensor& out) {
  CpuKernelCall call(op);
  for (const auto& [tensor, name] : inputs) {
    call.note(*tensor, name);
  }
  call.note(out, "out", /*written=*/true);
  call.check();
}

// An out= kernel launched on the current stream (launch_operands_kernel), for
// what an openreg kernel leaves to CPU's: kernel(t) runs with t the tensors
// of out and `inputs`, in that order, and anything else it needs captured by
// value. The inputs are checked first as CpuKernelCall checks them (named in
// errors as given): a 0-dim CPU operand is taken, as CUDA takes one, and
// copied for the kernel. With kDeviceTensors, cpu_tensors_of(t) gives CPU
// tensors for CPU's kernel on a slower path.
template <bool kCpu, size_t N, typename Kernel>
void launch_out_kernel(
    const char* op,
    SeenDtypes& seen,
    const NamedInput (&inputs)[N],
    const at::Tensor& out,
    Kernel&& kernel) {
  check_out_operands(op, inputs, out);
  std::array<const at::TensorBase*, N + 1> tensors{&out};
  for (size_t i = 0; i < N; ++i) {
    tensors[i + 1] = inputs[i].first;
  }
  launch_operands_kernel<kCpu>(out.device().index(), op, seen, tensors, std::forward<Kernel>(kernel));
}

} // namespace openreg
