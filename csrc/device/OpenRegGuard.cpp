// DeviceGuardImplInterface for PrivateUse1: what c10::DeviceGuard, OptionalDeviceGuard
// and torch.accelerator use to switch the current openreg device.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "memory/OpenRegAllocator.h"
#include "device/OpenRegDevice.h"
#include "device/OpenRegGpuTrace.h"
#include "device/OpenRegStream.h"
#include "device/OpenRegException.h"

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

  c10::Stream getStream(c10::Device d) const override {
    return current_stream(d.index());
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    return default_stream(d.index());
  }

  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return stream_from_pool(d.index(), priority);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool is_high_priority) const override {
    return stream_from_pool(d.index(), is_high_priority ? -1 : 0);
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    return exchange_stream(s);
  }

  void* getStreamNativeHandle(const c10::Stream s) const override {
    return raw_stream(s);
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  // torch.accelerator.get_device_capability()["supported_dtypes"]: the dtypes
  // openreg tensors hold and convert, which are CPU's: not the quantized ones
  // (openreg refuses them), nor the bit-field and sub-byte shells, which no
  // device converts to or from.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device_index(d.index());
    c10::DeviceCapability capability;
#define OPENREG_DROP_UNCONVERTED(_, name)                             \
  if (!converts(c10::ScalarType::name)) {                             \
    capability.capability_data.supported_scalar_types.has_##name = 0; \
  }
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(OPENREG_DROP_UNCONVERTED)
#undef OPENREG_DROP_UNCONVERTED
    return capability;
  }

  static bool converts(c10::ScalarType t) {
    switch (t) {
      case c10::ScalarType::UInt1: case c10::ScalarType::UInt2: case c10::ScalarType::UInt3:
      case c10::ScalarType::UInt4: case c10::ScalarType::UInt5: case c10::ScalarType::UInt6:
      case c10::ScalarType::UInt7: case c10::ScalarType::Int1: case c10::ScalarType::Int2:
      case c10::ScalarType::Int3: case c10::ScalarType::Int4: case c10::ScalarType::Int5:
      case c10::ScalarType::Int6: case c10::ScalarType::Int7: case c10::ScalarType::Float4_e2m1fn_x2:
        return false;
      default:
        return !c10::isQIntType(t) && !c10::isBitsType(t);
    }
  }

  bool queryStream(const c10::Stream& stream) const override {
    orStream_t raw = raw_stream(stream);
    const orError status = orStreamQuery(raw);
    if (status == orError::NotReady) {
      return false;
    }
    OPENREG_CHECK(status);
    // Seeing the stream idle orders the host after its work, as a
    // synchronize would; CUDA's guard reports no query, so a program that
    // polls instead of synchronizing would look unsynchronised to the sanitizer.
    gpu_trace::stream_synchronization(raw);
    return true;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    synchronize_stream(stream);
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    synchronize(device_index);
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    device_allocator()->recordStream(data_ptr, stream);
  }

  // Events: torch.Event and c10::Event create the runtime event lazily, on
  // their first record, with timing when the flag asks for it.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(
        device_index == -1 || device_index == stream.device_index(), "event of openreg:",
        static_cast<int>(device_index), " cannot be recorded on a stream of openreg:",
        static_cast<int>(stream.device_index()), ": record it on a stream of its own device.");
    orStream_t raw = raw_stream(stream);
    if (*event == nullptr) {
      orEvent_t created = nullptr;
      OPENREG_CHECK(orEventCreateWithFlags(
          &created, flag == c10::EventFlag::BACKEND_DEFAULT ? orEventDefault : orEventDisableTiming));
      *event = created;
      gpu_trace::event_creation(created);
    }
    OPENREG_CHECK(orEventRecord(static_cast<orEvent_t>(*event), raw));
    gpu_trace::event_record(static_cast<orEvent_t>(*event), raw);
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) {
      return; // never recorded: nothing to wait for, as in CUDA
    }
    orStream_t raw = raw_stream(stream);
    OPENREG_CHECK(orStreamWaitEvent(raw, static_cast<orEvent_t>(event)));
    gpu_trace::event_wait(static_cast<orEvent_t>(event), raw);
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) {
      return true;
    }
    const orError status = orEventQuery(static_cast<orEvent_t>(event));
    if (status == orError::NotReady) {
      return false;
    }
    OPENREG_CHECK(status);
    gpu_trace::event_synchronization(static_cast<orEvent_t>(event)); // as queryStream
    return true;
  }

  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      gpu_trace::event_synchronization(static_cast<orEvent_t>(event));
      OPENREG_CHECK(orEventSynchronize(static_cast<orEvent_t>(event)));
    }
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event != nullptr) {
      gpu_trace::event_deletion(static_cast<orEvent_t>(event));
      (void)orEventDestroy(static_cast<orEvent_t>(event));
    }
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(
        start != nullptr && end != nullptr,
        "Both events must be recorded before calculating elapsed time.");
    float ms = 0;
    const orError status = orEventElapsedTime(&ms, static_cast<orEvent_t>(start), static_cast<orEvent_t>(end));
    TORCH_CHECK(
        status != orError::InvalidHandle,
        "Both events must be created with enable_timing=True to calculate elapsed time.");
    TORCH_CHECK(
        status != orError::NotReady,
        "Both events must be completed before calculating elapsed time: call synchronize() on the end event first.");
    OPENREG_CHECK(status);
    return ms;
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
