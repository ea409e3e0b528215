// torch_openreg._C: the thin Python surface over the ATen glue. Everything a
// user calls goes through torch_openreg.openreg (torch.openreg), not here.
#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include <chrono>
#include <thread>

#include "aten/OpenRegAllocator.h"
#include "aten/OpenRegDevice.h"
#include "aten/OpenRegException.h"
#include "aten/OpenRegGenerator.h"
#include "aten/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace {

py::object default_generator(c10::DeviceIndex index) {
  return py::reinterpret_steal<py::object>(
      THPGenerator_initDefaultGenerator(openreg::default_generator(index)));
}

py::dict device_properties(int index) {
  openreg::check_device_index(static_cast<c10::DeviceIndex>(index));
  openreg::orDeviceProp prop{};
  OPENREG_CHECK(openreg::orGetDeviceProperties(&prop, index));
  py::dict d;
  d["name"] = std::string(prop.name);
  d["total_memory"] = prop.total_memory;
  d["major"] = prop.major;
  d["minor"] = prop.minor;
  d["multi_processor_count"] = prop.multi_processor_count;
  return d;
}

c10::Stream stream_of(int64_t stream_id, int device_index) {
  return c10::Stream(
      c10::Stream::UNSAFE,
      c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index)), stream_id);
}

// Keeps the current stream busy for `ms` milliseconds without blocking the
// caller, like torch.cuda._sleep: tests use it to observe asynchrony.
void sleep_on_current_stream(double ms) {
  const c10::Stream stream = openreg::current_stream(openreg::current_device());
  auto* duration = new std::chrono::duration<double, std::milli>(ms);
  OPENREG_CHECK(openreg::orLaunchHostFunc(
      openreg::raw_stream(stream),
      [](void* data) {
        auto* d = static_cast<std::chrono::duration<double, std::milli>*>(data);
        std::this_thread::sleep_for(*d);
        delete d;
      },
      duration));
}

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Bindings of the openreg PrivateUse1 backend (use torch.openreg instead).";
  m.def("_init", &openreg::ensure_initialized, "Validates the configuration; raises on a bad one.");
  m.def("_is_initialized", &openreg::is_initialized);
  m.def("_device_count", [] { return static_cast<int>(openreg::device_count()); });
  m.def("_get_device", [] { return static_cast<int>(openreg::current_device()); });
  m.def("_set_device", [](int index) { openreg::set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("_synchronize", [](int index) { openreg::synchronize(static_cast<c10::DeviceIndex>(index)); });
  m.def("_get_device_properties", &device_properties);
  m.def("_stream_priority", [](int64_t stream_id, int device_index) {
    return openreg::stream_priority(stream_of(stream_id, device_index));
  });
  m.def("_stream_priority_range", [] {
    int least = 0;
    int greatest = 0;
    OPENREG_CHECK(openreg::orDeviceGetStreamPriorityRange(&least, &greatest));
    return std::make_pair(least, greatest);
  });
  m.def("_sleep", &sleep_on_current_stream, "Queues a wait of `ms` milliseconds on the current stream.");
  m.def("_install_fault_handler", [] { OPENREG_CHECK(openreg::orInstallFaultHandler()); },
        "Puts openreg's device-memory fault report in front of SIGSEGV handlers installed since.");
  m.def("_default_generator", [](int index) { return default_generator(static_cast<c10::DeviceIndex>(index)); });
}
