// Runs an AOTInductor package compiled for openreg from C++, without Python:
//
//   run_package <package.pt2>
//
// The program links torch (libtorch, libtorch_cpu, libc10) and torch_openreg's
// extension library _C. Loading _C registers openreg with torch as its static
// initialisers run: the kernels, the allocator, the device guard, and the
// AOTInductor runner for packages whose device is "openreg"
// (csrc/compiler/OpenRegAotiRunner.cpp); the package's generated code finds
// openreg's functions in the program (openreg_inductor_function,
// csrc/compiler/OpenRegInductorLaunch.h). What Python does at `import torch_openreg`
// beyond that, the program does itself: it names PrivateUse1 "openreg".
// build.py builds it; tests/test_aoti.py builds and runs it.
#include <iomanip>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/DeviceType.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " <package.pt2>\n";
    return 2;
  }
  c10::register_privateuse1_backend("openreg");
  const c10::Device device("openreg:0");

  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  std::cout << "device " << loader.get_metadata()["AOTI_DEVICE_KEY"] << "\n";

  // The input tests/test_aoti.py gives the same package on the CPU.
  const at::Tensor input = (at::arange(64, at::kFloat).reshape({4, 16}) / 10).to(device);
  const std::vector<at::Tensor> outputs = loader.run({input});
  for (const at::Tensor& output : outputs) {
    std::cout << "output " << output.device() << " " << output.sizes() << "\n";
    const at::Tensor values = output.cpu().contiguous().flatten();
    for (int64_t i = 0; i < values.numel(); ++i) {
      std::cout << std::setprecision(9) << values[i].item<float>() << (i + 1 < values.numel() ? " " : "\n");
    }
  }
  return 0;
}
