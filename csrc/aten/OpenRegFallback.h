// The CPU fallback for operators without an openreg kernel.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace openreg {

// Boxed kernel: runs the operator's CPU kernel directly on host aliases of the
// openreg operands (no staging copies), so in-place ops and out= write device
// memory, views stay views, and fresh results are moved to the operands' device.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Boxed kernel for operators in the yaml blocklist: raises NotImplementedError
// with the reason the yaml gives.
[[noreturn]] void raise_blocked(const c10::OperatorHandle& op, const char* reason);

namespace generated {
// Defined by the generated RegisterFallback.cpp from backend_functions.yaml
// (fallback.cpu_tensor_args): operators that, as on CUDA, accept CPU tensors
// of any shape beside device tensors (e.g. CPU indices for indexing).
bool op_accepts_cpu_tensors(const c10::OperatorName& name);
} // namespace generated

} // namespace openreg
