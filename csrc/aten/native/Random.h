// normal_ on kernel addresses (Random.cpp), for DeviceGeneric.cpp's normal_.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>

namespace openreg::native {

// Whether normal_fill computes, for `self`, what CPU's normal_ kernel would
// for a CPU tensor like it: a float, double, half or bfloat16 tensor of 16 or
// more contiguous elements, on a machine whose CPU kernel normal_fill knows.
bool normal_fill_applies(const at::Tensor& self);

// Fills `self` in place with CPU's draws from `generator` (whose lock it
// takes), on kernel addresses. The caller joined the current stream and
// checked normal_fill_applies and std >= 0.
void normal_fill(const at::Tensor& self, double mean, double std, at::CPUGeneratorImpl* generator);

} // namespace openreg::native
