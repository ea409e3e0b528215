${banner}
//
// The PrivateUse1 kernels of torch's DispatchStubs: structured impl()s (and
// other native code) call `stub(device_type(), ...)`, which for an openreg
// TensorIterator lands here, behind a trace scope (TracedStub). Route
// `stub_kernel`: an openreg function the yaml's `stubs.kernels` names; route
// `stub_cpu_kernel`: CPU's kernel of the stub on device memory, for every stub
// that takes a TensorIterator (`stubs.cpu_kernels`).
#include <ATen/native/DispatchStub.h>

${stub_headers}

${openreg_headers}

${namespaces}
