// The torch headers most translation units include, precompiled once per build
// (setup.py: PrecompiledHeader) and given with -include to every unit that
// includes one of them (the others compile without it: loading it costs more
// than they parse).
// Parsing them costs more than compiling most units' own code
// (docs/development.md).
//
// Only torch's headers belong here: they do not change between builds (setup.py
// reads them from build/torch-headers), while a project header here would
// recompile every unit whenever it changed. Each unit still includes what it
// uses; this file only makes those includes free, so a unit compiles the same
// with or without it (a compiler that cannot use the precompiled form parses
// nothing extra: setup.py then leaves the -include out).
//
// ATen/native/RangeFactories.h has no include guard and stays out.
//
// ATen/native/Resize.h brings ATen/NativeFunctions.h (every native function's
// declaration), which makes the precompiled header much larger and slower to
// build, but is worth it: without it, a clean build took longer, most units
// parsing parts of it (docs/performance.md, "Measurements behind comments").
#include <ATen/DeviceGuard.h>
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/native/Activation.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/Fill.h>
#include <ATen/native/IndexKernel.h>
#include <ATen/native/Lerp.h>
#include <ATen/native/PointwiseOps.h>
#include <ATen/native/Pow.h>
#include <ATen/native/ReduceOps.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>
