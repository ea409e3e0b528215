#include "aten/OpenRegInductorLaunch.h"

#include <algorithm>
#include <exception>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include "aten/OpenRegLaunch.h"
#include "aten/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

extern "C" const char* openreg_inductor_kernel_pointers(
    const char* name,
    void* const* tensors,
    int64_t count,
    void** pointers) {
  thread_local std::string error;
  try {
    openreg::HostKernelLaunch launch;
    launch.name = name;
    bool host_tensors = false;
    c10::SmallVector<c10::DeviceIndex, 2> devices;
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
      launch.device = t.device().index();
      launch.work = std::max<int64_t>(launch.work, t.numel());
      if (std::find(devices.begin(), devices.end(), launch.device) == devices.end()) {
        devices.push_back(launch.device);
      }
    }
    // Two devices: no one stream orders the kernel.
    launch.at_once = host_tensors || devices.size() > 1;
    if (launch.at_once) {
      for (const c10::DeviceIndex device : devices) {
        openreg::join_current_stream(device);
      }
    }
    openreg::set_next_host_kernel(launch);
    return nullptr;
  } catch (const std::exception& e) {
    error = e.what();
    return error.c_str();
  }
}
