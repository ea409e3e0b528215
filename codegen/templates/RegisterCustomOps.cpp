${banner}
//
// The operators of the `${namespace}` library (the yaml's `custom_ops`, route
// `custom_op`): each schema, its PrivateUse1 kernel behind a wrapper, its Meta
// kernel (FakeTensor and torch.compile trace with it) and its autograd kernel.
#include <ATen/DeviceGuard.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/adaption.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "${native_header}"
#include "${device_header}"
#include "${trace_header}"

namespace at {
namespace {

${definitions}

} // namespace

TORCH_LIBRARY(${namespace}, m) {
  ${schemas}
}

TORCH_LIBRARY_IMPL(${namespace}, PrivateUse1, m) {
  ${device_registrations}
}

// Shapes and dtypes only: FakeTensor and torch.compile trace with these.
TORCH_LIBRARY_IMPL(${namespace}, Meta, m) {
  ${meta_registrations}
}

TORCH_LIBRARY_IMPL(${namespace}, AutogradPrivateUse1, m) {
  ${autograd_registrations}
}

} // namespace at
