// DeviceGuardImplInterface for PrivateUse1: what c10::DeviceGuard, OptionalDeviceGuard
// and torch.accelerator use to switch the current openreg device.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "OpenRegDevice.h"
#include "OpenRegException.h"

namespace openreg {
namespace {

struct OpenRegGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override {
    return static_type;
  }

  c10::Device exchangeDevice(c10::Device d) const override {
    check_type(d);
    const c10::Device old = getDevice();
    if (old.index() != d.index()) {
      set_device(d.index());
    }
    return old;
  }

  c10::Device getDevice() const override {
    return c10::Device(static_type, current_device());
  }

  void setDevice(c10::Device d) const override {
    check_type(d);
    set_device(d.index());
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    // Called from guard destructors, which must not throw; the index was valid
    // when the guard was entered.
    (void)orSetDevice(d.index());
  }

  // One in-order default stream per device until the runtime gains streams.
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  bool queryStream(const c10::Stream& /*stream*/) const override {
    return true; // work is synchronous, so a stream is always idle
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    synchronize(stream.device_index());
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    synchronize(device_index);
  }

 private:
  static void check_type(c10::Device d) {
    TORCH_CHECK(d.is_privateuseone(), "openreg device guard was given a ", d.type(), " device");
  }
};

// C10_REGISTER_GUARD_IMPL (c10/core/impl/DeviceGuardImplInterface.h) makes
// DeviceGuard(Device(PrivateUse1, i)) dispatch here.
C10_REGISTER_GUARD_IMPL(PrivateUse1, OpenRegGuardImpl);

} // namespace
} // namespace openreg
