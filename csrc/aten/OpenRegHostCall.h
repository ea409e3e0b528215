// One call of a CPU kernel on openreg tensors.
//
// The simulated device's memory is host memory, so torch's CPU kernel of an
// operator can run on it directly: each openreg operand is replaced by a host
// alias (OpenRegHostAlias.h), the CPU kernel runs, and its results come back as
// openreg tensors without a copy. Two users:
// - the wrappers that backend_functions.yaml's `cpu_kernels` section generates
//   (unboxed: the codegen knows every argument's type);
// - the boxed CPU fallback (OpenRegFallback.cpp) for every other operator.
//
// A call runs in three steps:
//   1. note() each argument: where the call runs, and a clear error for
//      operands on two devices, CPU operands where CUDA would refuse them, or a
//      generator of the wrong device;
//   2. begin(): a device guard, the kernel ordered after the current stream's
//      work, and CPU allocations redirected to the device's memory until
//      finish(), so fresh results are already device memory;
//   3. host() / written() / device() / generator() give the CPU kernel its
//      arguments; after it ran, finish() updates the written operands (an out=
//      the CPU kernel resized) and result() turns each result into an openreg
//      tensor: an operand itself, a view of an operand's memory, or fresh
//      device memory adopted as it is.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/List.h>
#include <ATen/core/operator_name.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>

namespace openreg {

class HostCall {
 public:
  // `op` names the operator in error messages ("aten::mm"); CPU tensors of any
  // shape are accepted only when `accepts_cpu_tensors` (indices for indexing,
  // as on CUDA), otherwise only 0-dim ones that are not written.
  explicit HostCall(const char* op, bool accepts_cpu_tensors = false);
  HostCall(const c10::OperatorName& op, bool accepts_cpu_tensors);
  HostCall(const HostCall&) = delete;
  HostCall& operator=(const HostCall&) = delete;
  ~HostCall();

  // Step 1.
  void note(const at::Tensor& t, const char* argument, bool written = false);
  void note(const std::optional<at::Tensor>& t, const char* argument);
  void note(at::ITensorListRef tensors, const char* argument);
  void note(const c10::List<std::optional<at::Tensor>>& tensors, const char* argument);
  void note(const std::optional<at::Device>& device, const char* argument);
  void note(const std::optional<at::Generator>& generator, const char* argument);

  // Step 2.
  void begin();

  // Step 3: the CPU kernel's arguments.
  at::Tensor host(const at::Tensor& t);
  at::Tensor written(const at::Tensor& t);
  std::optional<at::Tensor> host(const std::optional<at::Tensor>& t);
  std::vector<at::Tensor> host(at::ITensorListRef tensors);
  c10::List<std::optional<at::Tensor>> host(const c10::List<std::optional<at::Tensor>>& tensors);
  c10::Storage host(const c10::Storage& storage);
  std::optional<at::Device> device(const std::optional<at::Device>& device) const;
  // The openreg generator's CPU generator; with none given, the device's
  // default generator (CPU kernels would otherwise draw from CPU's).
  std::optional<at::Generator> generator(const std::optional<at::Generator>& generator) const;

  // After the kernel.
  void finish();
  at::Tensor result(const at::Tensor& t);
  std::vector<at::Tensor> result(const std::vector<at::Tensor>& tensors);

  // The openreg device the call runs on, if any operand or argument names one.
  const std::optional<c10::Device>& where() const {
    return device_;
  }

 private:
  // A device storage and its host alias: an operand's (device_storage_impl,
  // kept alive by the operand), or the fresh memory of a result
  // (device_storage, with a null device_storage_impl).
  struct Alias {
    c10::StorageImpl* device_storage_impl;
    c10::Storage device_storage;
    c10::Storage host_storage;
    c10::DispatchKeySet keys; // of the first operand on this storage, for views
  };
  struct Written {
    c10::MaybeOwned<at::Tensor> device_tensor;
    at::Tensor alias;
  };

  std::string op_name() const;
  void note_device(c10::Device device, const char* argument);
  const Alias& alias_of(const at::Tensor& t);
  at::Tensor host(const at::Tensor& t, bool borrow);
  // An operand of the caller's: borrowed when the caller's reference outlives
  // the call (an unboxed wrapper's arguments), which spares reference counting
  // on tensors that Python also holds (each count change from 1 to 2 and back
  // goes through the Python object).
  c10::MaybeOwned<at::Tensor> keep(const at::Tensor& t, bool borrow) const {
    return borrow ? c10::MaybeOwned<at::Tensor>::borrowed(t) : c10::MaybeOwned<at::Tensor>::owned(std::in_place, t);
  }
  void write_back(const Written& w);

  const char* op_ = nullptr;
  const c10::OperatorName* op_name_ = nullptr; // instead of op_ (the fallback)
  const bool accepts_cpu_tensors_;
  // The fallback replaces its stack's tensors by their aliases, so HostCall
  // owns its operands there; generated wrappers' arguments outlive the call.
  const bool borrows_operands_;
  std::optional<c10::Device> device_;
  const char* device_argument_ = nullptr;
  const char* cpu_argument_ = nullptr;
  bool openreg_generator_ = false;
  bool other_generator_ = false;
  std::optional<c10::DeviceGuard> guard_;
  bool redirecting_ = false;
  c10::DeviceIndex previous_redirect_ = -1;
  c10::SmallVector<Alias, 4> aliases_;
  c10::SmallVector<Written, 2> written_;
  // (host alias, operand): one alias per operand, so an operand passed twice
  // (self and out= of an in-place op) is one tensor for the CPU kernel too,
  // and a result that is an operand itself returns as that operand.
  c10::SmallVector<std::pair<at::Tensor, c10::MaybeOwned<at::Tensor>>, 4> operands_;
};

} // namespace openreg
