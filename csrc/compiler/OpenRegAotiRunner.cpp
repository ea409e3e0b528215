// AOTInductor's runner for packages compiled for openreg: what
// torch._inductor.aoti_load_package and torch::inductor::AOTIModelPackageLoader
// create for a package whose metadata names the device "openreg" (they look the
// device up in getAOTIModelRunnerRegistry(),
// torch/csrc/inductor/aoti_runner/model_container_runner.h).
//
// The generated model (torch/csrc/inductor/aoti_runtime/model_base.h) accepts
// only "cpu", "cuda", "xpu" and "mps" in its device string
// (parse_device_str), so the runner hands it "cpu:<index>"; the openreg C++
// wrapper's model constructor then sets the model's device type to
// PrivateUse1 (torch_openreg/openreg/_inductor.py, OpenRegCppWrapperCodegen):
// its buffers are openreg tensors on device <index>, and its first run copies
// its constants there.
//
// It also replaces torch's runner of CPU packages by one that refuses openreg
// inputs: a CPU package's kernels would read their device addresses, which
// ends the process with openreg's fault report (docs/integration/device.md); torch's
// loader cannot refuse earlier, since a package names its device and the
// loader is given no other.
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner_cpu.h>

namespace {

// Raises `refusal(i, input)` for the first input `accepts` refuses, after
// freeing every input handle: the model would have taken them over, and an
// exception out of run_impl leaves them to nobody (the inputs' memory would
// never be freed). An AtenTensorHandle is an at::Tensor* made with new
// (torch/csrc/inductor/aoti_torch/utils.h, new_tensor_handle).
template <typename Accepts, typename Refusal>
void check_inputs(std::vector<AtenTensorHandle>& handles, Accepts accepts, Refusal refusal) {
  for (size_t i = 0; i < handles.size(); ++i) {
    const at::Tensor& input = *reinterpret_cast<const at::Tensor*>(handles[i]);
    if (!input.defined() || accepts(input)) {
      continue;
    }
    const std::string message = refusal(i, input);
    for (AtenTensorHandle handle : handles) {
      delete reinterpret_cast<at::Tensor*>(handle);
    }
    handles.clear();
    TORCH_CHECK(false, message);
  }
}

std::string model_device(const std::string& device) {
  const auto colon = device.find(':');
  return colon == std::string::npos ? std::string("cpu") : "cpu" + device.substr(colon);
}

class OpenRegModelContainerRunner : public torch::inductor::AOTIModelContainerRunner {
 public:
  OpenRegModelContainerRunner(
      const std::string& model_so_path,
      size_t num_models,
      const std::string& device_str,
      const std::string& bin_dir,
      bool run_single_threaded)
      : AOTIModelContainerRunner(model_so_path, num_models, model_device(device_str), bin_dir, run_single_threaded),
        device_(device_str) {}

 protected:
  // The generated kernels take every input for openreg memory: a CPU tensor's
  // address would reach them as a device address.
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& input_handles, void* stream_handle) override {
    check_inputs(
        input_handles, [](const at::Tensor& input) { return input.is_privateuseone(); },
        [&](size_t i, const at::Tensor& input) {
          return c10::str(
              "This AOTInductor package was compiled for openreg (loaded for ", device_, "), and its input ", i,
              " is on ", input.device(), ": its kernels read openreg memory only. Move the inputs with .to(\"",
              device_, "\"), or compile a package from a program exported with ", input.device().type(),
              " inputs.");
        });
    return AOTIModelContainerRunner::run_impl(input_handles, stream_handle);
  }

 private:
  std::string device_;
};

std::unique_ptr<torch::inductor::AOTIModelContainerRunner> create_runner(
    const std::string& model_so_path,
    size_t num_models,
    const std::string& device_str,
    const std::string& bin_dir,
    const bool run_single_threaded) {
  return std::make_unique<OpenRegModelContainerRunner>(
      model_so_path, num_models, device_str, bin_dir, run_single_threaded);
}

const torch::inductor::RegisterAOTIModelRunner registration("openreg", &create_runner);

class CpuModelContainerRunner : public torch::inductor::AOTIModelContainerRunnerCpu {
 public:
  using AOTIModelContainerRunnerCpu::AOTIModelContainerRunnerCpu;

 protected:
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& input_handles, void* stream_handle) override {
    check_inputs(
        input_handles, [](const at::Tensor& input) { return !input.is_privateuseone(); },
        [](size_t i, const at::Tensor& input) {
          return c10::str(
              "This AOTInductor package was compiled for cpu, and its input ", i, " is on ", input.device(),
              ": a CPU package's kernels cannot read openreg memory. Pass CPU tensors, or compile the "
              "package from a program exported with openreg inputs to run it on openreg.");
        });
    return AOTIModelContainerRunnerCpu::run_impl(input_handles, stream_handle);
  }
};

std::unique_ptr<torch::inductor::AOTIModelContainerRunner> create_cpu_runner(
    const std::string& model_so_path,
    size_t num_models,
    const std::string& /*device_str*/,
    const std::string& /*bin_dir*/,
    const bool run_single_threaded) {
  return std::make_unique<CpuModelContainerRunner>(model_so_path, num_models, run_single_threaded);
}

// Registered after torch's (libtorch_cpu is initialised before this library).
const torch::inductor::RegisterAOTIModelRunner cpu_registration("cpu", &create_cpu_runner);

} // namespace
