// Turns a runtime error code into a c10::Error that Python sees as RuntimeError.
#pragma once

#include <c10/util/Exception.h>

#include "runtime/OpenRegRuntime.h"

#define OPENREG_CHECK(EXPR)                                            \
  do {                                                                 \
    const ::openreg::orError __err = (EXPR);                           \
    TORCH_CHECK(                                                       \
        __err == ::openreg::orError::Success,                          \
        "openreg runtime error: ", ::openreg::orGetErrorString(__err), \
        " (from ", #EXPR, ")");                                        \
  } while (0)
