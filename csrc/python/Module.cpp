// torch_openreg._C: the thin Python surface over the ATen glue. Everything a
// user calls goes through torch_openreg.openreg (torch.openreg), not here.
#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include "aten/OpenRegAllocator.h"
#include "aten/OpenRegDevice.h"
#include "aten/OpenRegGenerator.h"

namespace {

py::object default_generator(c10::DeviceIndex index) {
  return py::reinterpret_steal<py::object>(
      THPGenerator_initDefaultGenerator(openreg::default_generator(index)));
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
  m.def("_default_generator", [](int index) { return default_generator(static_cast<c10::DeviceIndex>(index)); });
}
