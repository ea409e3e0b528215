${banner}
//
// Operators served by an openreg kernel (the yaml's `kernels`, route `kernel`):
// each wrapper has the dispatcher's signature (SymInt where the schema has
// SymInt), checks devices, guards the device and calls the kernel with its
// native signature.
#include <ATen/DeviceGuard.h>
#include <ATen/core/op_registration/adaption.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "${native_header}"
#include "${device_header}"
#include "${trace_header}"

namespace at {
namespace {

${wrappers}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  ${registrations}
}

${optional_blocks}
} // namespace at
