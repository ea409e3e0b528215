// Routes: how openreg serves a call, and the table of what
// backend_functions.yaml decided.
//
// Route is the project's one vocabulary for it: the yaml's sections and keys,
// codegen.model.Route (whose values route_name returns), the dispatch trace,
// the profiler, `python -m codegen --list` and `python -m torch_openreg info`
// use these names. docs/adding_an_op.md has the table of what each one costs.
//
// The generated RegisterRoutes.cpp registers the route table at static
// initialisation (RouteRegistration), as TORCH_LIBRARY_IMPL registers kernels:
// code in this layer reads the yaml's decisions here instead of calling up
// into generated code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/operator_name.h>

namespace openreg {

enum class Route : uint8_t {
  Kernel, // an openreg function with the operator's signature
  Structured, // torch's meta(), CPU's impl() on the device tensors (stubs reach the device)
  StructuredImpl, // torch's meta(), an openreg impl()
  StructuredOnCpuAliases, // torch's meta(), CPU's impl() on CPU aliases of the tensors
  CpuKernel, // the operator's CPU kernel on CPU aliases of the tensors
  StubKernel, // an openreg function with a DispatchStub's type
  StubCpuKernel, // CPU's kernel of a TensorIterator stub on device memory
  CustomOp, // an operator of the openreg library
  Fallback, // the boxed CPU fallback
  Blocked, // raises NotImplementedError with the yaml's reason
  NestedFallback, // on a nested tensor: its NestedTensorCPU kernel on CPU aliases
  NestedBlocked, // on a nested tensor: no nested kernel, or nested tensors refused
  SparseFallback, // on a sparse tensor: its SparseCPU / SparseCsrCPU kernel on CPU aliases
  SparseBlocked, // on a sparse tensor: no sparse CPU kernel, or sparse tensors refused
};
inline constexpr int kRouteCount = static_cast<int>(Route::SparseBlocked) + 1;

// The route's name in the yaml's vocabulary: "kernel", "structured_impl", ...
const char* route_name(Route route);

// One operator or stub the yaml binds.
struct Binding {
  const char* name; // "aten::add.out", "openreg::add_relu", "at::native::add_stub"
  Route route;
  const char* detail; // the function that serves it, or a blocked operator's reason
};

struct RouteTable {
  bool global_fallback = false; // fallback.global: the CPU fallback for every other operator
  bool nested_fallback = false; // fallback.nested: the nested CPU fallback, or nested tensors refused
  bool sparse_fallback = false; // fallback.sparse: the sparse CPU fallback, or sparse tensors refused
  std::vector<Binding> bindings;
  // Operator names ("aten::copy_", "aten::index.Tensor") of fallback.cpu_tensor_args
  // and fallback.cpu_results.
  std::vector<const char*> cpu_tensor_args;
  std::vector<const char*> cpu_results;
};

// Registers the yaml's route table; the generated RegisterRoutes.cpp holds one.
// A second registration (a library generated from another yaml, loaded later)
// adds its bindings and operator lists; the first one's fallback policy stays.
struct RouteRegistration {
  explicit RouteRegistration(RouteTable table);
};

// The registered table (empty before registration).
const RouteTable& route_table();

// Operators that, as on CUDA, accept CPU tensors of any shape beside device
// tensors (e.g. CPU indices for indexing).
bool accepts_cpu_tensors(const c10::OperatorName& name);

// Operators whose fresh results torch keeps on the CPU for every device, as
// the metadata of nested tensors (aten::_nested_tensor_size).
bool returns_cpu_tensors(const c10::OperatorName& name);

// The reason the yaml gives for blocking `name`, or nullptr.
const char* blocked_reason(const c10::OperatorName& name);

} // namespace openreg
