// The per-device random number generator.
//
// An openreg generator owns a CPUGeneratorImpl and forwards seeding and state to
// it. CPU kernels run on device memory (the fallback, later native kernels) take
// that CPU generator, so every random op on openreg draws from the openreg
// device's generator and torch.openreg.manual_seed makes them reproducible.
#pragma once

#include <optional>

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace openreg {

class OpenRegGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit OpenRegGeneratorImpl(c10::DeviceIndex device_index);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  static c10::DeviceType device_type() {
    return c10::DeviceType::PrivateUse1;
  }

  // The CPU generator that CPU kernels running on this device must use.
  const at::Generator& cpu_generator() const {
    return cpu_;
  }

 private:
  OpenRegGeneratorImpl* clone_impl() const override;
  mutable at::Generator cpu_; // mutable: locking its mutex is not a state change
};

const at::Generator& default_generator(c10::DeviceIndex device_index);

// The CPU generator a CPU kernel must draw from for openreg tensors of
// `device_index`: an openreg generator's own, or with none given the device's
// default one. A generator of another device raises, as CUDA's
// check_generator does; `op` names the operator in that message. The
// reference lives as long as `generator` (or the process, for the default).
const at::Generator& cpu_generator_for(
    const std::optional<at::Generator>& generator,
    c10::DeviceIndex device_index,
    const char* op);
at::Generator new_generator(c10::DeviceIndex device_index);

} // namespace openreg
