#pragma once

// The c10d backend a ProcessGroupOpenRegGloo registers for the device type
// openreg (torch_openreg/openreg/distributed.py): what C++ code gets when it
// asks that group for its openreg backend (ProcessGroup::getBackend).

#include <pybind11/pybind11.h>

#include <string>

namespace openreg {

// A torch._C._distributed_c10d.Backend named `name` whose collectives call the
// methods of the Python process group `group` (held by a weak reference: the
// group holds the backend). Raises if `group`'s class leaves one of those
// methods to torch.distributed.ProcessGroup, whose C++ would come back here.
pybind11::object process_group_backend(pybind11::handle group, int rank, int size, const std::string& name);

} // namespace openreg
