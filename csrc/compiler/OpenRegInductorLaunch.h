// Kernel calls of Inductor's C++ wrapper (torch._inductor.config.cpp_wrapper=True)
// on openreg: the wrapper is C++ that holds tensors as AtenTensorHandles (torch's
// C shim, torch/csrc/inductor/aoti_torch/c/shim.h) and calls each generated C++
// kernel with raw pointers. An openreg tensor's data pointer is a device address
// that CPU code must not touch (docs/integration/device.md), so the wrapper asks this
// function for the addresses kernels use, and for where the kernel goes, then
// hands the kernel to openreg_launch_host_kernel (OpenRegLaunch.h), as the
// Python wrapper's bindings do (torch_openreg/openreg/_inductor.py).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include "operators/OpenRegLaunch.h"

namespace openreg {

// Where a generated kernel goes, from its tensors, for both wrappers (the
// Python wrapper's _kernel_arguments in csrc/python, the C++ wrapper's
// openreg_inductor_kernel_pointers): each openreg operand is add()ed, then
// launch() sets the next openreg_launch_host_kernel of this thread: queued on
// the current stream of the one device, or at once after joining the streams
// involved when CPU tensors (host memory is not stream-ordered) or two devices
// are among the operands.
class HostKernelOperands {
 public:
  explicit HostKernelOperands(const char* name);
  void add(const at::Tensor& openreg_tensor);
  void launch(bool host_tensors);

 private:
  HostKernelLaunch launch_;
  c10::SmallVector<c10::DeviceIndex, 2> devices_;
};

} // namespace openreg

// For each of the `count` tensors (AtenTensorHandle, i.e. at::Tensor*), the
// address the kernel reads: an openreg tensor's data at its kernel address
// (orKernelAddress), any other tensor's data_ptr(). Sets where the next
// openreg_launch_host_kernel of this thread runs the kernel, like the Python
// wrapper's _kernel_arguments (csrc/python/Module.cpp): queued on the current
// stream of the tensors' device, or at once, after joining the streams
// involved, when CPU tensors (host memory is not stream-ordered) or two
// devices are among them. `name` names the kernel in errors and profiles and
// must outlive the kernel (a string literal of the wrapper). Returns nullptr,
// or a message that the caller throws (no C++ exception crosses this C
// boundary); the message lives until the thread's next call.
extern "C" const char* openreg_inductor_kernel_pointers(
    const char* name,
    void* const* tensors,
    int64_t count,
    void** pointers);

// The function the C++ wrapper calls by `name`: openreg_inductor_kernel_pointers,
// openreg_launch_host_kernel, or the C shim aoti_torch_openreg_<op> of an extern
// kernel (generated: build/generated/InductorCShims.cpp); nullptr for another
// name. The wrapper finds this function with dlsym(RTLD_DEFAULT) when the
// program linked torch_openreg._C (a C++ program), else at the address
// torch_openreg puts in the environment (_C is loaded privately by Python).
extern "C" void* openreg_inductor_function(const char* name);
