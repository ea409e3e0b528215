// Turns a runtime error code into a c10::Error that Python sees as
// RuntimeError; a kernel's failure (LaunchFailure) into c10::AcceleratorError
// (torch.AcceleratorError, a RuntimeError), as CUDA's errors are.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "runtime/OpenRegRuntime.h"

namespace openreg {

[[noreturn]] inline void raise_runtime_error(orError err, const char* expr, const char* file, uint32_t line) {
  if (err == orError::LaunchFailure) {
    throw c10::AcceleratorError(
        {__func__, file, line}, static_cast<int32_t>(err),
        c10::str(
            "openreg kernel failed: ", orGetLaunchError(),
            orLaunchBlocking() ? ""
                               : "\nopenreg kernels run asynchronously, so this is reported by a later call than "
                                 "the one that launched the kernel; set OPENREG_LAUNCH_BLOCKING=1 to raise it "
                                 "at the launch."));
  }
  TORCH_CHECK(false, "openreg runtime error: ", orGetErrorString(err), " (from ", expr, ")");
}

} // namespace openreg

#define OPENREG_CHECK(EXPR)                                                             \
  do {                                                                                  \
    const ::openreg::orError __err = (EXPR);                                            \
    if (C10_UNLIKELY(__err != ::openreg::orError::Success)) {                           \
      ::openreg::raise_runtime_error(__err, #EXPR, __FILE__, static_cast<uint32_t>(__LINE__)); \
    }                                                                                   \
  } while (0)
