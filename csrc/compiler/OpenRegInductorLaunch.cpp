#include "compiler/OpenRegInductorLaunch.h"

#include <algorithm>
#include <exception>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include "operators/OpenRegLaunch.h"
#include "device/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {

HostKernelOperands::HostKernelOperands(const char* name) {
  launch_.name = name;
}

void HostKernelOperands::add(const at::Tensor& openreg_tensor) {
  launch_.device = openreg_tensor.device().index();
  launch_.work = std::max<int64_t>(launch_.work, openreg_tensor.numel());
  if (std::find(devices_.begin(), devices_.end(), launch_.device) == devices_.end()) {
    devices_.push_back(launch_.device);
  }
}

void HostKernelOperands::launch(bool host_tensors) {
  // Two devices: no one stream orders the kernel.
  launch_.at_once = host_tensors || devices_.size() > 1;
  if (launch_.at_once) {
    for (const c10::DeviceIndex device : devices_) {
      join_current_stream(device);
    }
  }
  set_next_host_kernel(launch_);
}

} // namespace openreg

extern "C" const char* openreg_inductor_kernel_pointers(
    const char* name,
    void* const* tensors,
    int64_t count,
    void** pointers) {
  thread_local std::string error;
  try {
    openreg::HostKernelOperands operands(name);
    bool host_tensors = false;
    for (int64_t i = 0; i < count; ++i) {
      // An AtenTensorHandle is an at::Tensor* (torch/csrc/inductor/aoti_torch/utils.h,
      // tensor_handle_to_tensor_pointer).
      const at::Tensor& t = *static_cast<const at::Tensor*>(tensors[i]);
      if (!t.defined()) {
        pointers[i] = nullptr;
        continue;
      }
      if (!t.is_privateuseone()) {
        pointers[i] = t.data_ptr();
        host_tensors = true;
        continue;
      }
      pointers[i] = openreg::orKernelAddress(t.data_ptr());
      operands.add(t);
    }
    operands.launch(host_tensors);
    return nullptr;
  } catch (const std::exception& e) {
    error = e.what();
    return error.c_str();
  }
}
