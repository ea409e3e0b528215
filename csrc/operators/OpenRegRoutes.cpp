#include "operators/OpenRegRoutes.h"

#include <c10/util/Exception.h>

namespace openreg {
namespace {

// The table and its operator lists parsed into OperatorNames once.
struct Registry {
  RouteTable table;
  std::vector<c10::OperatorName> cpu_tensor_args;
  std::vector<c10::OperatorName> cpu_results;
  bool registered = false;
};

Registry& registry() {
  static Registry r;
  return r;
}

c10::OperatorName parse(const char* qualified) {
  const std::string text(qualified);
  const size_t dot = text.find('.');
  return dot == std::string::npos ? c10::OperatorName(text, "")
                                  : c10::OperatorName(text.substr(0, dot), text.substr(dot + 1));
}

bool contains(const std::vector<c10::OperatorName>& names, const c10::OperatorName& name) {
  for (const c10::OperatorName& n : names) {
    if (n == name) {
      return true;
    }
  }
  return false;
}

} // namespace

const char* route_name(Route route) {
  switch (route) {
    case Route::Kernel:
      return "kernel";
    case Route::Structured:
      return "structured";
    case Route::StructuredImpl:
      return "structured_impl";
    case Route::StructuredOnCpuAliases:
      return "structured_on_cpu_aliases";
    case Route::CpuKernel:
      return "cpu_kernel";
    case Route::StubKernel:
      return "stub_kernel";
    case Route::StubCpuKernel:
      return "stub_cpu_kernel";
    case Route::CustomOp:
      return "custom_op";
    case Route::Fallback:
      return "fallback";
    case Route::Blocked:
      return "blocked";
    case Route::NestedFallback:
      return "nested_fallback";
    case Route::NestedBlocked:
      return "nested_blocked";
    case Route::SparseFallback:
      return "sparse_fallback";
    case Route::SparseBlocked:
      return "sparse_blocked";
  }
  return "?";
}

RouteRegistration::RouteRegistration(RouteTable table) {
  Registry& r = registry();
  for (const char* name : table.cpu_tensor_args) {
    r.cpu_tensor_args.push_back(parse(name));
  }
  for (const char* name : table.cpu_results) {
    r.cpu_results.push_back(parse(name));
  }
  if (!r.registered) {
    r.table = std::move(table);
    r.registered = true;
    return;
  }
  // A library generated from another yaml and loaded after the extension
  // (tests/test_adding_an_op.py builds one) adds its bindings; the fallback
  // policy stays the extension's.
  r.table.bindings.insert(r.table.bindings.end(), table.bindings.begin(), table.bindings.end());
}

const RouteTable& route_table() {
  return registry().table;
}

bool accepts_cpu_tensors(const c10::OperatorName& name) {
  return contains(registry().cpu_tensor_args, name);
}

bool returns_cpu_tensors(const c10::OperatorName& name) {
  return contains(registry().cpu_results, name);
}

const char* blocked_reason(const c10::OperatorName& name) {
  const std::string qualified = c10::toString(name);
  for (const Binding& b : registry().table.bindings) {
    if (b.route == Route::Blocked && qualified == b.name) {
      return b.detail;
    }
  }
  return nullptr;
}

} // namespace openreg
