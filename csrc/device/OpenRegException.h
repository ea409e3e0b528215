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
  TORCH_CHECK(
      err != orError::StreamCaptureUnsupported, "openreg runtime error: ", orGetErrorString(err), " (from ", expr,
      "). The current stream is being captured into a graph, and this call waits for it or for the device: a "
      "synchronization, a copy to the host, .item(), an operator whose result's shape depends on the device's "
      "values, or one with an argument on the CPU. Make it before capture_begin or after capture_end. The "
      "capture is now invalid: capture_end will raise.");
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
