#pragma once

// The contexts of memory history (memory/OpenRegAllocator.h's GatherContext):
// the allocating thread's stack, and its frames for _snapshot().

#include <c10/core/Allocator.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

namespace openreg {

// The calling thread's Python stack (and TorchScript's, when it runs some),
// as torch::CapturedTraceback::gather(python=true, script=true, cpp=false)
// records it. Read from the thread's own frames without the GIL; a stack
// equal to one this thread gathered lately is that same context, so the
// allocations and frees of a loop share a few contexts, and only a new stack
// takes the GIL (to reference its code objects).
std::shared_ptr<c10::GatheredContext> gather_python_stack();

// Also the C++ frames (stacks="all"): torch's CapturedTraceback.
std::shared_ptr<c10::GatheredContext> gather_python_and_cpp_stack();

// The frames of each context, innermost first, as torch.cuda.memory._snapshot
// gives them (lists of {"name", "filename", "line"}), symbolized once per
// distinct frame; an empty list for null. Called with the GIL.
std::vector<pybind11::object> symbolize_stacks(const std::vector<const c10::GatheredContext*>& contexts);

} // namespace openreg
