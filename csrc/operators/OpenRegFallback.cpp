#include "operators/OpenRegFallback.h"

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "operators/cpu/OpenRegBoxedCpuKernel.h"
#include "operators/OpenRegRoutes.h"
#include "operators/OpenRegTrace.h"

namespace openreg {
namespace {

std::atomic<FallbackMode> mode{FallbackMode::Silent};

// Operators that ran through the fallback, and those already warned about.
struct Stats {
  std::mutex mutex;
  std::unordered_map<c10::OperatorName, int64_t> counts;
  std::unordered_set<c10::OperatorName> warned;
};

Stats& stats() {
  static Stats* s = new Stats(); // leaked: fallbacks may run during exit
  return *s;
}

// Counts the call; in Warn mode, warns the first time an operator falls back.
void note_fallback(const c10::OperatorName& name, FallbackMode current) {
  Stats& s = stats();
  bool first_warning = false;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    ++s.counts[name];
    if (current == FallbackMode::Warn) {
      first_warning = s.warned.insert(name).second;
    }
  }
  if (first_warning) {
    TORCH_WARN(
        c10::toString(name), " has no openreg kernel and ran on the CPU fallback (OPENREG_FALLBACK=warn "
        "warns once per operator). To run it natively, give it a kernel in backend_functions.yaml "
        "(docs/adding_an_op.md).");
  }
}

} // namespace

void set_fallback_mode(FallbackMode m) {
  mode.store(m, std::memory_order_relaxed);
  if (m == FallbackMode::Warn) {
    Stats& s = stats();
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.warned.clear(); // switching to warn warns again
  }
}

FallbackMode fallback_mode() {
  return mode.load(std::memory_order_relaxed);
}

std::vector<std::pair<std::string, int64_t>> fallback_stats() {
  Stats& s = stats();
  const std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(s.counts.size());
  for (const auto& [name, count] : s.counts) {
    out.emplace_back(c10::toString(name), count);
  }
  return out;
}

void reset_fallback_stats() {
  Stats& s = stats();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.counts.clear();
}

namespace {

// Both fallbacks: unless OPENREG_FALLBACK=error (then the operator's name and
// `forbidden` are the error), runs the operator's `key` kernel on CPU aliases
// of its openreg tensors and counts the call.
void run_on_cpu_aliases(
    const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKey key, const char* forbidden) {
  const c10::OperatorName& name = op.operator_name();
  const FallbackMode current = fallback_mode();
  TORCH_CHECK_NOT_IMPLEMENTED(current != FallbackMode::Error, c10::toString(name), forbidden);
  run_cpu_kernel_boxed(op, stack, key);
  note_fallback(name, current);
}

} // namespace

namespace {

[[noreturn]] void refuse_quantized(const c10::OperatorName& name) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, c10::toString(name),
      ": openreg has no quantized tensors (torch 2.13 deprecates them). Quantize and run quantized "
      "operators on CPU tensors, or keep the tensor in a floating-point dtype on openreg.");
}

// Whether a dense call asks for a quantized dtype (quantize_per_tensor's
// `dtype`): CPU's kernel would make a QuantizedCPU tensor, which no openreg
// tensor can hold.
bool asks_for_quantized(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& arguments = op.schema().arguments();
  const size_t begin = stack.size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& v = stack[begin + i];
    c10::TypePtr type = arguments[i].real_type();
    if (type->kind() == c10::TypeKind::OptionalType) {
      type = type->castRaw<c10::OptionalType>()->getElementType();
    }
    if (type->kind() == c10::TypeKind::ScalarTypeType && v.isInt() &&
        c10::isQIntType(static_cast<c10::ScalarType>(v.toInt()))) {
      return true;
    }
  }
  return false;
}

bool returns_quantized(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  for (const c10::IValue& v : torch::jit::last(stack, op.schema().returns().size())) {
    if (v.isTensor() && v.toTensor().defined() && c10::isQIntType(v.toTensor().scalar_type())) {
      return true;
    }
  }
  return false;
}

// Every operator on a quantized openreg tensor (QuantizedPrivateUse1), which
// only a quantized CPU tensor's .to("openreg") could ask for.
void quantized_fallback(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  refuse_quantized(op.operator_name());
}

} // namespace

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantized_fallback>());
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.operator_name();
  const trace::Scope scope(name, Route::Fallback);
  if (C10_UNLIKELY(asks_for_quantized(op, *stack))) {
    refuse_quantized(name);
  }
  run_on_cpu_aliases(
      op, stack, c10::DispatchKey::CPU,
      " has no openreg kernel, and OPENREG_FALLBACK=error forbids running it on the CPU fallback. "
      "Give it a kernel in backend_functions.yaml (kernels:, structured: or cpu_kernels:; see "
      "docs/adding_an_op.md), or allow the fallback with torch.openreg.set_fallback_mode(\"silent\").");
  if (C10_UNLIKELY(returns_quantized(op, *stack))) {
    torch::jit::drop(*stack, op.schema().returns().size());
    refuse_quantized(name);
  }
}

void nested_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.operator_name();
  // Without a NestedTensorCPU entry the redispatch would raise torch's "Could
  // not run ... 'NestedTensorCPU' backend", which names neither openreg nor a
  // way out. (CompositeImplicitAutograd operators never get here: they
  // decompose above this key, on openreg as on CPU.)
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU)) {
    const trace::Scope scope(name, Route::NestedBlocked);
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, c10::toString(name),
        " got a nested tensor of the strided layout on openreg, but torch has no kernel for it on nested "
        "tensors of that layout (no NestedTensorCPU kernel, so CPU raises too; openreg runs torch's "
        "NestedTensorCPU kernels on the device memory). Use torch.nested's jagged layout "
        "(layout=torch.jagged), or apply the operator to the tensors of nt.unbind().");
  }
  const trace::Scope scope(name, Route::NestedFallback);
  run_on_cpu_aliases(
      op, stack, c10::DispatchKey::NestedTensorCPU,
      " got a nested tensor of the strided layout, which openreg runs on the nested CPU fallback only "
      "(torch's NestedTensorCPU kernel on the device memory), and OPENREG_FALLBACK=error forbids it. "
      "Allow the fallback with torch.openreg.set_fallback_mode(\"silent\"), or use torch.nested's "
      "jagged layout (layout=torch.jagged), whose operators run on openreg's dense kernels.");
}

namespace {

// A layout as Python names it ("torch.sparse_csr").
const char* python_layout(c10::Layout layout) {
  switch (layout) {
    case c10::kSparse:
      return "torch.sparse_coo";
    case c10::kSparseCsr:
      return "torch.sparse_csr";
    case c10::kSparseCsc:
      return "torch.sparse_csc";
    case c10::kSparseBsr:
      return "torch.sparse_bsr";
    case c10::kSparseBsc:
      return "torch.sparse_bsc";
    default:
      return "sparse";
  }
}

// The layout of the first sparse tensor among the operator's arguments, for
// errors.
const char* sparse_layout_of(const torch::jit::Stack& stack, size_t arguments) {
  for (size_t i = stack.size() - arguments; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().layout() != c10::kStrided) {
      return python_layout(v.toTensor().layout());
    }
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (t.defined() && t.layout() != c10::kStrided) {
          return python_layout(t.layout());
        }
      }
    }
  }
  return "sparse"; // a factory (layout=torch.sparse_coo, device="openreg")
}

// copy_ is the one operator whose tensors may be on two devices. torch's
// sparse copy_ (copy_sparse_) moves the source's indices and values to the
// destination's device; the CPU kernel sees CPU aliases only, so a source on
// another openreg device is moved first, as .to() moves it.
void move_copy_source(const c10::OperatorName& name, torch::jit::Stack& stack) {
  static const c10::OperatorName copy{"aten::copy_", ""};
  if (name != copy) {
    return;
  }
  // copy_(Tensor(a!) self, Tensor src, bool non_blocking=False)
  const at::Tensor& self = stack[stack.size() - 3].toTensor();
  c10::IValue& src = stack[stack.size() - 2];
  if (self.is_privateuseone() && src.toTensor().is_privateuseone() && src.toTensor().device() != self.device()) {
    src = src.toTensor().to(self.device());
  }
}

// Both sparse fallbacks: `key` the dispatch key served (for the trace),
// `cpu_key` the CPU kernel's.
void run_sparse_fallback(
    const c10::OperatorHandle& op, torch::jit::Stack* stack, const char* key, c10::DispatchKey cpu_key) {
  const c10::OperatorName& name = op.operator_name();
  if (!op.hasComputedKernelForDispatchKey(cpu_key)) {
    // Without it the redispatch would raise torch's "Could not run ... 'SparseCPU'
    // backend", which names neither openreg nor a way out.
    const trace::Scope scope(name, Route::SparseBlocked, key);
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, c10::toString(name), " got a ", sparse_layout_of(*stack, op.schema().arguments().size()),
        " tensor on openreg, but torch has no ", c10::toString(cpu_key),
        " kernel for it (so CPU raises too): openreg runs sparse operators only through torch's sparse CPU "
        "kernels on the device memory (the sparse fallback). Convert with .to_dense() (or another sparse "
        "layout that CPU serves for this operator), or run it on CPU tensors.");
  }
  const trace::Scope scope(name, Route::SparseFallback, key);
  move_copy_source(name, *stack);
  run_on_cpu_aliases(
      op, stack, cpu_key,
      " got a sparse tensor, which openreg runs on the sparse CPU fallback only (torch's sparse CPU kernel "
      "on the device memory), and OPENREG_FALLBACK=error forbids it. Allow the fallback with "
      "torch.openreg.set_fallback_mode(\"silent\"), or convert with .to_dense().");
}

} // namespace

void sparse_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_sparse_fallback(op, stack, "SparsePrivateUse1", c10::DispatchKey::SparseCPU);
}

void sparse_compressed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_sparse_fallback(op, stack, "SparseCsrPrivateUse1", c10::DispatchKey::SparseCsrCPU);
}

void refuse_sparse(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const trace::Scope scope(op.operator_name(), Route::SparseBlocked);
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, c10::toString(op.schema().operator_name()), " got a ",
      sparse_layout_of(*stack, op.schema().arguments().size()),
      " tensor on openreg, and backend_functions.yaml turns the sparse CPU fallback off (fallback.sparse: "
      "false). Convert with .to_dense(), or keep sparse tensors on CPU.");
}

void blocked_kernel(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  const trace::Scope scope(op.operator_name(), Route::Blocked);
  const char* reason = blocked_reason(op.operator_name());
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, c10::toString(op.schema().operator_name()), " is blocked on openreg: ",
      reason != nullptr ? reason : "it is in the blocklist",
      " (backend_functions.yaml, fallback.blocklist). Run it on CPU tensors instead, or give it an "
      "openreg kernel in backend_functions.yaml.");
}

void refuse_nested(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  const trace::Scope scope(op.operator_name(), Route::NestedBlocked);
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, c10::toString(op.schema().operator_name()),
      " got a nested tensor of the strided layout on openreg, and backend_functions.yaml turns the nested "
      "CPU fallback off (fallback.nested: false). Use "
      "torch.nested's jagged layout (layout=torch.jagged), or keep nested tensors on CPU; "
      "nn.TransformerEncoder makes one in its inference fast path when given a padding mask "
      "(construct it with enable_nested_tensor=False).");
}

} // namespace openreg
