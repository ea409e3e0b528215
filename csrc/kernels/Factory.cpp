// Allocation kernels: empty.memory_format, empty_strided, new_empty,
// _efficientzerotensor.
// The generated wrapper has already set the device guard from `device`, so the
// allocator allocates on the requested openreg device.
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/new_empty_native.h>

#include "OpenRegNativeFunctions.h"
#include "memory/OpenRegAllocator.h"
#include "device/OpenRegDevice.h"
#include "operators/OpenRegTensorFormat.h"

namespace openreg::native {
namespace {
constexpr c10::DispatchKeySet kOpenRegKeys(c10::DispatchKey::PrivateUse1);

void check_factory_options(std::optional<at::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(
      c10::layout_or_default(layout) == c10::Layout::Strided,
      "openreg supports only strided tensors, got layout=", c10::layout_or_default(layout),
      "; create the tensor on CPU for other layouts.");
  TORCH_CHECK(
      !c10::pinned_memory_or_default(pin_memory),
      "Only dense CPU tensors can be pinned: drop pin_memory=True for openreg tensors.");
}

// Under torch.use_deterministic_algorithms(True) new memory reads as NaN (the
// largest value for integers and bool), as CPU's and CUDA's empty make it,
// unless torch.utils.deterministic.fill_uninitialized_memory is False.
at::Tensor filled_if_deterministic(at::Tensor tensor) {
  if (C10_UNLIKELY(
          at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory())) {
    at::native::fill_empty_deterministic_(tensor);
  }
  return tensor;
}
} // namespace

at::Tensor empty_memory_format(
    at::IntArrayRef size,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout,
    std::optional<at::Device> /*device*/,
    std::optional<bool> pin_memory,
    std::optional<at::MemoryFormat> memory_format) {
  check_factory_options(layout, pin_memory);
  return filled_if_deterministic(at::detail::empty_generic(
      size, device_allocator(), kOpenRegKeys, c10::dtype_or_default(dtype), memory_format));
}

// A tensor that reads as zeros and owns no memory (autograd's zero gradients:
// sgn's backward), as CUDA's _efficientzerotensor_cuda makes it: torch's
// ZeroTensor fallback materialises it where an operator needs its elements.
at::Tensor efficientzerotensor(
    at::IntArrayRef size,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout,
    std::optional<at::Device> /*device*/,
    std::optional<bool> pin_memory) {
  check_factory_options(layout, pin_memory);
  at::native::ZeroTensorAllocator allocator(c10::Device(c10::DeviceType::PrivateUse1, current_device()));
  return at::detail::empty_generic(
      size, &allocator, kOpenRegKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
      c10::dtype_or_default(dtype), std::nullopt);
}

at::Tensor empty_strided(
    at::IntArrayRef size,
    at::IntArrayRef stride,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout,
    std::optional<at::Device> /*device*/,
    std::optional<bool> pin_memory) {
  check_factory_options(layout, pin_memory);
  return filled_if_deterministic(at::detail::empty_strided_generic(
      size, stride, device_allocator(), kOpenRegKeys, c10::dtype_or_default(dtype)));
}

// torch's new_empty (CompositeExplicitAutograd) plus the format tag of `self`:
// Tensor.__deepcopy__ rebuilds a tensor as self.new_empty([]).set_(copied
// storage), so this is how a deep copy keeps the tag (docs/integration/device.md).
at::Tensor new_empty(
    const at::Tensor& self,
    at::IntArrayRef size,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout,
    std::optional<at::Device> device,
    std::optional<bool> pin_memory) {
  at::Tensor result = at::native::new_empty_symint(self, c10::fromIntArrayRefSlow(size), dtype, layout, device, pin_memory);
  copy_tensor_format(self, result);
  return result;
}

} // namespace openreg::native
