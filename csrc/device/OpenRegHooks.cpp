// PrivateUse1HooksInterface: how device-generic parts of torch (autograd's
// device handling, torch.Generator, torch.accelerator, storage resizing) reach
// this backend. Registered once at load through RegisterPrivateUse1HooksInterface.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "memory/OpenRegAllocator.h"
#include "device/OpenRegDevice.h"
#include "device/OpenRegGenerator.h"
#include "device/OpenRegException.h"
#include "memory/OpenRegHostAllocator.h"

namespace openreg {
namespace {

struct OpenRegHooks final : public at::PrivateUse1HooksInterface {
  void init() const override {
    ensure_initialized();
  }

  bool isBuilt() const override {
    return true;
  }

  bool isAvailable() const override {
    return device_count() > 0;
  }

  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return is_initialized();
  }

  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_device(device);
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex old = current_device();
    if (device != old) {
      set_device(device);
    }
    return old;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    orPointerAttributes attributes;
    OPENREG_CHECK(orPointerGetAttributes(&attributes, data));
    TORCH_CHECK(attributes.is_device, "pointer ", data, " is not openreg device memory");
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(attributes.device));
  }

  bool isPinnedPtr(const void* data) const override {
    orPointerAttributes attributes;
    return orPointerGetAttributes(&attributes, data) == orError::Success && attributes.is_pinned_host;
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return pinned_host_allocator();
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
};

struct RegisterHooks {
  RegisterHooks() {
    static OpenRegHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }
};
const RegisterHooks register_hooks;

} // namespace
} // namespace openreg
