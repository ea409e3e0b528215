${banner}
//
// Operators whose own CPU kernel runs on CPU aliases of the device memory (the
// yaml's `cpu_kernels`, route `cpu_kernel`): see ${call_header}.
#include <tuple>

#include <torch/library.h>

${cpu_function_headers}

#include "${boxed_header}"
#include "${call_header}"
#include "${trace_header}"

namespace at {
namespace {

${wrappers}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  ${registrations}
}

} // namespace at
