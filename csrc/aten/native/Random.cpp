// The openreg kernels of uniform_stub, random_stub, random_from_to_stub and
// random_full_64_bits_range_stub, behind torch's device-generic uniform_ and
// random_ (DeviceGeneric.cpp), which check the arguments and build a nullary
// iterator over `self`.
//
// CPU's kernels for these stubs pick the CPU generator and call the templates
// of ATen/native/cpu/DistributionTemplates.h, which draw one value per
// element in order, under the generator's lock. These kernels call the same
// templates with the CPU generator of the openreg generator (or of the
// device's default one), so the numbers are CPU's for the same seed
// (tests/test_generators.py compares them), without a second trip through the
// stub and the copies of an optional Generator (atomic reference counts) that
// calling the CPU stub would cost. The templates use Loops.h, which compiles
// per CPU capability; draws are serial, so the baseline one gives the same
// values, except where CPU's build may fuse a multiply and an add (uniform_
// over a range other than [0, 1), which therefore calls CPU's kernel).
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/native/cpu/DistributionTemplates.h>

#include "OpenRegNativeFunctions.h"
#include "aten/OpenRegGenerator.h"
#include "aten/native/CpuStub.h"

namespace openreg::native {
namespace {

// Points the iterator at kernel addresses (after the current stream's work)
// and returns the CPU generator to draw from.
at::CPUGeneratorImpl* prepare(
    at::TensorIteratorBase& iter,
    const std::optional<at::Generator>& generator,
    const char* op) {
  use_kernel_addresses(iter);
  return cpu_generator_for(generator, iter.device().index(), op).get<at::CPUGeneratorImpl>();
}

} // namespace

void uniform_kernel(
    at::TensorIteratorBase& iter,
    const double from,
    const double to,
    std::optional<at::Generator> generator) {
  if (from != 0.0 || to != 1.0) {
    // value·(to − from) + from: CPU's kernel, built for this machine's vector
    // instructions, may fuse it into one rounding; this file, built for the
    // baseline, would round twice. Over [0, 1) the product and sum are exact.
    run_cpu_stub(at::native::uniform_stub, iter, from, to, cpu_generator_for(generator, iter.device().index(), "aten::uniform_"));
    return;
  }
  at::CPUGeneratorImpl* cpu = prepare(iter, generator, "aten::uniform_");
  at::native::templates::cpu::uniform_kernel(iter, from, to, cpu);
}

void random_kernel(at::TensorIteratorBase& iter, std::optional<at::Generator> generator) {
  at::CPUGeneratorImpl* cpu = prepare(iter, generator, "aten::random_");
  at::native::templates::cpu::random_kernel(iter, cpu);
}

void random_from_to_kernel(
    at::TensorIteratorBase& iter,
    const uint64_t range,
    const int64_t base,
    std::optional<at::Generator> generator) {
  at::CPUGeneratorImpl* cpu = prepare(iter, generator, "aten::random_");
  at::native::templates::cpu::random_from_to_kernel(iter, range, base, cpu);
}

void random_full_64_bits_range_kernel(at::TensorIteratorBase& iter, std::optional<at::Generator> generator) {
  at::CPUGeneratorImpl* cpu = prepare(iter, generator, "aten::random_");
  at::native::templates::cpu::random_full_64_bits_range_kernel(iter, cpu);
}

} // namespace openreg::native
