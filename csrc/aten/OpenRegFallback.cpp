#include "OpenRegFallback.h"

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "OpenRegCpuKernelCall.h"
#include "OpenRegRoutes.h"
#include "OpenRegTrace.h"

namespace openreg {
namespace {

bool is_generator_argument(const c10::Argument& argument) {
  c10::TypePtr type = argument.real_type();
  if (type->kind() == c10::TypeKind::OptionalType) {
    type = type->castRaw<c10::OptionalType>()->getElementType();
  }
  return type->kind() == c10::TypeKind::GeneratorType;
}

bool is_written(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

// Calls `fn(tensor)` for a Tensor argument and for each tensor of a list argument.
template <typename Fn>
void for_each_tensor(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    fn(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor()) {
        fn(element.toTensor());
      }
    }
  }
}

// Replaces each tensor of a Tensor or list argument by `fn(tensor)`.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    return fn(value.toTensor());
  }
  if (value.isList()) {
    const c10::List<c10::IValue> list = value.toList();
    c10::impl::GenericList mapped(list.elementType());
    mapped.reserve(list.size());
    for (const c10::IValue& element : list) {
      mapped.push_back(element.isTensor() ? c10::IValue(fn(element.toTensor())) : element);
    }
    return mapped;
  }
  return value;
}

// One run of the fallback: a CpuKernelCall (OpenRegCpuKernelCall.h) driven by the
// operator's schema, over the boxed stack.
class FallbackCall {
 public:
  // `kernel_key`: where the operator's CPU kernel is, CPU for the dense
  // fallback, NestedTensorCPU for the nested one.
  FallbackCall(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKey kernel_key)
      : op_(op),
        kernel_key_(kernel_key),
        schema_(op.schema()),
        stack_(*stack),
        args_begin_(stack->size() - schema_.arguments().size()),
        call_(schema_.operator_name(), accepts_cpu_tensors(schema_.operator_name())) {}

  void run() {
    if (returns_cpu_tensors(schema_.operator_name())) {
      call_.keep_results_on_cpu();
    }
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      note(arguments[i], stack_[args_begin_ + i]);
    }
    call_.begin();
    for (size_t i = 0; i < arguments.size(); ++i) {
      to_cpu_aliases(arguments[i], stack_[args_begin_ + i]);
    }
    op_.redispatchBoxed(c10::DispatchKeySet(kernel_key_), &stack_);
    call_.finish();
    const size_t returns = schema_.returns().size();
    for (size_t i = stack_.size() - returns; i < stack_.size(); ++i) {
      stack_[i] = map_tensors(stack_[i], [&](const at::Tensor& t) { return call_.result(t); });
    }
  }

 private:
  void note(const c10::Argument& argument, const c10::IValue& value) {
    const char* name = argument.name().c_str();
    const bool written = is_written(argument);
    for_each_tensor(value, [&](const at::Tensor& t) { call_.note(t, name, written); });
    if (value.isDevice()) {
      call_.note(std::optional<at::Device>(value.toDevice()), name);
    } else if (value.isGenerator()) {
      call_.note(std::optional<at::Generator>(value.toGenerator()), name);
    }
  }

  void to_cpu_aliases(const c10::Argument& argument, c10::IValue& value) {
    if (is_written(argument)) {
      value = map_tensors(value, [&](const at::Tensor& t) { return call_.written(t); });
    } else {
      value = map_tensors(value, [&](const at::Tensor& t) { return call_.alias(t); });
    }
    if (value.isDevice()) {
      value = *call_.device(value.toDevice());
    } else if (value.isStorage()) {
      value = call_.alias(value.toStorage());
    } else if (value.isGenerator()) {
      value = *call_.generator(value.toGenerator());
    } else if (value.isNone() && is_generator_argument(argument)) {
      if (std::optional<at::Generator> generator = call_.generator(std::nullopt)) {
        value = *generator;
      }
    }
  }

  const c10::OperatorHandle& op_;
  const c10::DispatchKey kernel_key_;
  const c10::FunctionSchema& schema_;
  torch::jit::Stack& stack_;
  const size_t args_begin_;
  CpuKernelCall call_;
};

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
  FallbackCall(op, stack, key).run();
  note_fallback(name, current);
}

} // namespace

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.operator_name();
  const trace::Scope scope(name, Route::Fallback);
  run_on_cpu_aliases(
      op, stack, c10::DispatchKey::CPU,
      " has no openreg kernel, and OPENREG_FALLBACK=error forbids running it on the CPU fallback. "
      "Give it a kernel in backend_functions.yaml (kernels:, structured: or cpu_kernels:; see "
      "docs/adding_an_op.md), or allow the fallback with torch.openreg.set_fallback_mode(\"silent\").");
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
