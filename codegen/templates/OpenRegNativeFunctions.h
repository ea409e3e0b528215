${banner}
//
// Declarations of the hand-written functions the yaml names, with the
// signatures their callers need. The files that define them include this
// header (the codegen checks), and the pragma below makes a function they
// define without a declaration before it a compile error: a kernel whose
// parameters differ from its declaration would otherwise be another overload,
// the registrations would name the declared function, which no file defines,
// and the extension would build, then fail to load ("undefined symbol")
// wherever torch autoloads it. Helper functions in those files are `static`,
// in an anonymous namespace, or declared in a header.
#pragma once

#include <optional>
#include <type_traits>

#include <ATen/core/IListRef.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/Storage.h>

${stub_headers}

// Left on for the rest of the including file (no push/pop). Clang names the
// same check -Wmissing-prototypes.
#if defined(__clang__)
#pragma clang diagnostic error "-Wmissing-prototypes"
#elif defined(__GNUC__)
#pragma GCC diagnostic error "-Wmissing-declarations"
#endif

namespace ${namespace} {

${declarations}

} // namespace ${namespace}
