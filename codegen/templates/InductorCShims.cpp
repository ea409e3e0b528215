${banner}
//
// The C shims of the operators Inductor's C++ wrapper calls as extern kernels
// (torchgen/aoti/fallback_ops.py: extern_kernels.mm, aten fallbacks) for
// openreg graphs: aoti_torch_openreg_<op>, written by torchgen's own shim
// generator (gen_aoti_c_shim.gen_declaration_and_definition) with a call
// through the dispatcher (at::<op>), so that openreg's kernels or its CPU
// fallback serve them, as they serve the Python wrapper's aten calls. The
// generated wrapper reaches them through openreg_inductor_function(name)
// (csrc/compiler/OpenRegInductorLaunch.h), with the signature of torch's CPU shim
// of the same name (torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h).
#include <cstring>
#include <string_view>
#include <unordered_map>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

${operator_headers}

#include "${launch_header}"
#include "${host_kernel_header}"

using namespace torch::aot_inductor;

namespace {

${definitions}

} // namespace

extern "C" void* openreg_inductor_function(const char* name) {
  static const auto* functions = new std::unordered_map<std::string_view, void*>({
      {"openreg_inductor_kernel_pointers", reinterpret_cast<void*>(&openreg_inductor_kernel_pointers)},
      {"openreg_launch_host_kernel", reinterpret_cast<void*>(&openreg_launch_host_kernel)},
      ${table}
  });
  const auto it = functions->find(std::string_view(name, std::strlen(name)));
  return it == functions->end() ? nullptr : it->second;
}
