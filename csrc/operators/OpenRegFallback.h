// The CPU fallback for operators without an openreg kernel.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <utility>
#include <vector>

namespace openreg {

// Boxed kernel: runs the operator's CPU kernel directly on CPU aliases of the
// openreg operands (no staging copies), so in-place ops and out= write device
// memory, views stay views, and fresh results are moved to the operands' device.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// What the fallback does besides running the operator (OPENREG_FALLBACK,
// torch.openreg.set_fallback_mode): Silent counts it, Warn also warns once per
// operator, Error raises NotImplementedError instead of running it.
enum class FallbackMode { Silent, Warn, Error };
void set_fallback_mode(FallbackMode mode);
FallbackMode fallback_mode();

// How often each operator ran through the fallback ("aten::abs.out", count),
// since start or since reset_fallback_stats().
std::vector<std::pair<std::string, int64_t>> fallback_stats();
void reset_fallback_stats();

// Boxed kernel for operators in the yaml blocklist: raises NotImplementedError
// with the reason the yaml gives (blocked_reason, OpenRegRoutes.h).
[[noreturn]] void blocked_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The nested counterpart of cpu_fallback, for every operator on a nested
// openreg tensor of the strided layout (the NestedTensorPrivateUse1 key): each
// nested openreg operand becomes a NestedTensorCPU CPU alias (same nested
// sizes, strides and offsets over the same bytes), the operator's
// NestedTensorCPU kernel runs, and nested results come back as nested openreg
// tensors, as dense ones do from cpu_fallback. Counted and governed by the
// fallback mode like cpu_fallback; an operator without a NestedTensorCPU
// kernel raises NotImplementedError saying so.
void nested_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The boxed kernel for the NestedTensorPrivateUse1 key when the yaml turns the
// nested fallback off (fallback.nested: false): raises.
[[noreturn]] void refuse_nested(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The sparse counterparts, for every operator on a sparse openreg tensor: COO
// (the SparsePrivateUse1 key) and the compressed layouts CSR, CSC, BSR, BSC
// (SparseCsrPrivateUse1). Each sparse openreg operand becomes a sparse CPU
// tensor of the same layout, sizes and flags over CPU aliases of its indices
// and values, the operator's SparseCPU / SparseCsrCPU kernel runs, and sparse
// results come back as sparse openreg tensors over device memory. Counted and
// governed by the fallback mode like cpu_fallback; an operator without a
// sparse CPU kernel raises NotImplementedError naming it and the layout.
void sparse_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void sparse_compressed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The boxed kernel for both sparse keys when the yaml turns the sparse
// fallback off (fallback.sparse: false): raises.
[[noreturn]] void refuse_sparse(const c10::OperatorHandle& op, torch::jit::Stack* stack);

} // namespace openreg
