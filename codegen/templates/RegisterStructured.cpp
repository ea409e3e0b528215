${banner}
//
// Structured groups (the yaml's `structured`): each wrapper runs torch's meta()
// on an object of openreg's structured classes (${structured_header}), then
// impl(): CPU's on the device tensors (route `structured`), an openreg one
// (`structured_impl`), or CPU's on CPU aliases (`structured_on_cpu_aliases`).
#include <torch/library.h>

${torch_headers}

${openreg_headers}

namespace at {
namespace {

${wrappers}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  ${registrations}
}

} // namespace at
