// Random operators on kernel addresses without an iterator (Random.cpp), for
// DeviceGeneric.cpp's normal_, uniform_, random_ and bernoulli_.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>

namespace openreg::native {

// Whether uniform_fill and random_fill apply to `self`: a non-empty
// contiguous tensor (which CPU's serial kernels fill in memory order) of a
// dtype their CPU kernels take.
bool uniform_fill_applies(const at::Tensor& self);
bool random_fill_applies(const at::Tensor& self);

// uniform_(0, 1) and random_() of `self`: CPU's draws from `generator`, in
// memory order, written from `data` on: the kernel address of self's first
// element, or host memory of self's geometry (DeviceGeneric.cpp's DrawTarget).
void uniform_fill(const at::Tensor& self, void* data, at::CPUGeneratorImpl* generator);
void random_fill(const at::Tensor& self, void* data, at::CPUGeneratorImpl* generator);

// Whether bernoulli_fill applies to `self`: as random_fill_applies, on a
// machine where CPU's bernoulli_(p) kernel draws as that template does.
bool bernoulli_fill_applies(const at::Tensor& self);

// bernoulli_(p) of `self`, p in [0, 1]: as uniform_fill.
void bernoulli_fill(const at::Tensor& self, void* data, double p, at::CPUGeneratorImpl* generator);

// Whether randperm_fill applies: `out` is a 1-dim int64 or int32 tensor of
// n > 0 elements (any stride), n is below the size where CPU's kernel
// switches to its other shuffle, and CPU's kernel shuffles as randperm_fill
// does (checked once).
bool randperm_fill_applies(const at::Tensor& out, int64_t n);

// randperm(n) into `out`: CPU's permutation for `generator` (whose lock it
// takes), written from `data` on with out's stride, as uniform_fill.
void randperm_fill(const at::Tensor& out, void* data, int64_t n, at::CPUGeneratorImpl* generator);

// Whether normal_fill computes, for `self`, what CPU's normal_ kernel would
// for a CPU tensor like it: a float, double, half or bfloat16 tensor of 16 or
// more contiguous elements, on a machine whose CPU kernel normal_fill knows.
bool normal_fill_applies(const at::Tensor& self);

// Fills `self` with CPU's draws from `generator` (whose lock it takes),
// written from `data` on as uniform_fill. The caller checked
// normal_fill_applies and std >= 0.
void normal_fill(const at::Tensor& self, void* data, double mean, double std, at::CPUGeneratorImpl* generator);

} // namespace openreg::native
