${banner}
//
// What the yaml decides beyond single kernels: the fallbacks (routes
// `fallback`, `blocked`, `nested_fallback`, `nested_blocked`, `sparse_fallback`,
// `sparse_blocked`), and the route
// table csrc/operators/OpenRegRoutes.h keeps, which the fallback, `python -m
// torch_openreg info` and the coverage report read.
#include <torch/library.h>

#include "${fallback_header}"
#include "${routes_header}"

namespace {

const ::openreg::RouteRegistration registration({
    /*global_fallback=*/${global_fallback},
    /*nested_fallback=*/${nested_fallback},
    /*sparse_fallback=*/${sparse_fallback},
    // Every operator and stub the yaml binds, with its route and the function
    // that serves it (a blocked operator: its reason).
    /*bindings=*/{
        ${bindings}
    },
    // Operators that, as on CUDA, take CPU tensors of any shape beside openreg
    // tensors (fallback.cpu_tensor_args).
    /*cpu_tensor_args=*/{
        ${cpu_tensor_args}
    },
    // Operators whose fresh results torch keeps on the CPU for every device
    // (fallback.cpu_results).
    /*cpu_results=*/{
        ${cpu_results}
    },
});

} // namespace

${registrations}
