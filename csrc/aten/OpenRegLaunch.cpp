#include "aten/OpenRegLaunch.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "runtime/OpenRegRuntime.h"

namespace openreg {

namespace {

// A tensor like t over `data` on `device` (t's storage's nbytes), owning nothing.
at::Tensor unowned_tensor(const at::TensorBase& t, void* data, c10::Device device) {
  // A DataPtr without a deleter or context: nothing is freed with the view.
  c10::Storage storage(
      c10::Storage::use_byte_size_t(), t.storage().nbytes(), c10::DataPtr(data, device),
      /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage),
      c10::DispatchKeySet(device.is_cpu() ? c10::DispatchKey::CPU : c10::DispatchKey::PrivateUse1), t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  view._set_conj(t.is_conj());
  view._set_neg(t.is_neg());
  return view;
}

} // namespace

at::Tensor kernel_view(const at::TensorBase& t) {
  if (!t.defined()) {
    return {};
  }
  const c10::StorageImpl& memory = *t.storage().unsafeGetStorageImpl();
  return unowned_tensor(t, const_cast<void*>(memory.data()), memory.device());
}

at::Tensor kernel_cpu_view(const at::TensorBase& t) {
  TORCH_INTERNAL_ASSERT(t.device().is_privateuseone());
  return unowned_tensor(
      t, orKernelAddress(const_cast<void*>(t.storage().unsafeGetStorageImpl()->data())), c10::Device(c10::kCPU));
}

at::Tensor kernel_tensor_argument(const at::TensorBase& t) {
  if (!t.defined() || t.device().is_privateuseone()) {
    return kernel_view(t);
  }
  return at::Tensor(t).clone();
}

} // namespace openreg
