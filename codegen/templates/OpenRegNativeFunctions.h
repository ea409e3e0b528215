${banner}
//
// Declarations of the hand-written functions the yaml names, with the
// signatures their callers need: the kernels include this header, so a kernel
// whose signature does not match its operator or stub fails to compile.
#pragma once

#include <optional>
#include <type_traits>

#include <ATen/core/IListRef.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/Storage.h>

${stub_headers}

namespace ${namespace} {

${declarations}

} // namespace ${namespace}
