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
//
// A contiguous tensor needs no iterator: CPU's serial kernels fill it in
// memory order, so uniform_fill (over [0, 1)) and random_fill draw into it
// with a plain loop, which DeviceGeneric.cpp's uniform_ and random_ call
// instead of torch's implementation, on the memory its DrawTarget gives.
// bernoulli_fill does the same for bernoulli_(p) where CPU's kernel is that
// template too.
//
// normal_'s stub takes the tensor rather than an iterator; DeviceGeneric.cpp's
// normal_ calls normal_fill here when it computes what CPU's kernel would
// (normal_fill_applies): it draws the uniforms and transforms them 16 at a
// time in CPU's order, with the transform CPU's kernel uses on this machine:
// the header's scalar NormalFill16, or for float lanes on AVX2 and AVX-512
// machines the AVX2 one (NormalFillAvx2.cpp). normal_fill and bernoulli_fill
// check once, on 4096 values, that they give CPU's numbers (fills_like_cpu);
// where they do not, DeviceGeneric.cpp keeps CPU's kernel on a CPU alias.
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Version.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/ops/bernoulli_native.h>
#include <ATen/ops/normal_native.h>
#include <ATen/ops/randperm_native.h>
#include <ATen/native/cpu/DistributionTemplates.h>

#include "OpenRegNativeFunctions.h"
#include "device/OpenRegGenerator.h"
#include "kernels/CpuIterator.h"
#include "kernels/NormalFillAvx2.h"
#include "kernels/Random.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::native {
namespace {

// Points the iterator at kernel addresses (after the current stream's work)
// and returns the CPU generator to draw from.
at::CPUGeneratorImpl* prepare(
    at::TensorIteratorBase& iter,
    const std::optional<at::Generator>& generator,
    const char* op) {
  // Drawn in the calling thread, which owns the generator's state (a
  // queued kernel would advance it after later host code read it).
  join_current_stream(iter.device().index());
  use_kernel_addresses(iter);
  return cpu_generator_for(generator, iter.device().index(), op).get<at::CPUGeneratorImpl>();
}

// The floating-point dtypes CPU's random kernels take.
bool is_floating(const at::Tensor& self) {
  switch (self.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
      return true;
    default:
      return false;
  }
}

// Writes draw() into out[0 .. size), in order, under the generator's lock:
// what CPU's serial kernels do to a contiguous tensor through a nullary
// iterator.
template <typename scalar_t, typename Draw>
void draw_in_memory_order(scalar_t* out, int64_t size, at::CPUGeneratorImpl* generator, const Draw& draw) {
  std::lock_guard<std::mutex> lock(generator->mutex_);
  for (int64_t i = 0; i < size; ++i) {
    out[i] = draw();
  }
}

template <typename scalar_t>
void fill_bernoulli(scalar_t* out, int64_t size, double p, at::CPUGeneratorImpl* generator) {
  draw_in_memory_order(out, size, generator, [p, generator] {
    at::bernoulli_distribution<double> bernoulli(p);
    return static_cast<scalar_t>(bernoulli(generator));
  });
}

// Whether `fill(out, size, generator)` writes what `cpu_kernel(tensor,
// generator)`, CPU's kernel run directly, writes into a CPU tensor of 4096
// elements from the same seed. CPU's kernels are compiled with torch's
// compiler and flags; what the compiler may fuse or vectorize differently
// here (an unoptimized or sanitizer build, another compiler) shows as other
// bits, and the caller then keeps CPU's kernel.
template <typename scalar_t, typename CpuKernel, typename Fill>
bool fills_like_cpu(const CpuKernel& cpu_kernel, const Fill& fill) {
  constexpr int64_t kSize = 4096;
  constexpr uint64_t kSeed = 20261123;
  at::Tensor cpu = at::detail::empty_cpu({kSize}, c10::CppTypeToScalarType<scalar_t>::value);
  cpu_kernel(cpu, at::detail::createCPUGenerator(kSeed));
  std::vector<scalar_t> ours(kSize);
  const at::Generator generator = at::detail::createCPUGenerator(kSeed);
  fill(ours.data(), kSize, generator.get<at::CPUGeneratorImpl>());
  return std::memcmp(ours.data(), cpu.const_data_ptr(), sizeof(scalar_t) * kSize) == 0;
}

// randperm(n) into out[0], out[stride], ...: the identity, then a
// Fisher-Yates shuffle drawing one 32-bit random() per position, under the
// generator's lock. This is what CPU's kernel does for n below 2^32 / 20
// (randperm_fill_applies checks that it gives CPU's permutation).
template <typename scalar_t>
void fill_randperm(scalar_t* out, int64_t n, int64_t stride, at::CPUGeneratorImpl* generator) {
  std::lock_guard<std::mutex> lock(generator->mutex_);
  for (int64_t i = 0; i < n; ++i) {
    out[i * stride] = static_cast<scalar_t>(i);
  }
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(generator->random()) % (n - i);
    std::swap(out[i * stride], out[(z + i) * stride]);
  }
}

// The transform CPU's normal_ kernel applies to float lanes on this machine.
enum class FloatTransform { kScalar, kAvx2, kUnknown };

FloatTransform capability_transform() {
  const std::string capability = at::get_cpu_capability();
  if (capability == "DEFAULT") {
    return FloatTransform::kScalar;
  }
  if ((capability == "AVX2" || capability == "AVX512") && have_normal_fill_16_avx2()) {
    return FloatTransform::kAvx2;
  }
  return FloatTransform::kUnknown;
}

// CPU's normal_fill on a raw pointer: uniform draws, then `transform16` on
// each block of 16; a size that is not a multiple of 16 draws its last 16
// values again and transforms them. Half and bfloat16 draw and transform in
// float, a block at a time.
template <typename scalar_t, typename Transform16>
void fill_normal(scalar_t* data, int64_t size, at::CPUGeneratorImpl* generator, const Transform16& transform16) {
  using opmath_t = at::opmath_type<scalar_t>;
  std::lock_guard<std::mutex> lock(generator->mutex_);
  at::uniform_real_distribution<opmath_t> uniform(0, 1);
  if constexpr (std::is_same_v<scalar_t, opmath_t>) {
    for (int64_t i = 0; i < size; ++i) {
      data[i] = uniform(generator);
    }
    for (int64_t i = 0; i + 16 <= size; i += 16) {
      transform16(data + i);
    }
    if (size % 16 != 0) {
      scalar_t* last = data + size - 16;
      for (int j = 0; j < 16; ++j) {
        last[j] = uniform(generator);
      }
      transform16(last);
    }
  } else {
    opmath_t block[16];
    auto fill_block = [&](int64_t offset) {
      for (int j = 0; j < 16; ++j) {
        block[j] = uniform(generator);
      }
      transform16(block);
      for (int j = 0; j < 16; ++j) {
        data[offset + j] = static_cast<scalar_t>(block[j]);
      }
    };
    for (int64_t i = 0; i + 16 <= size; i += 16) {
      fill_block(i);
    }
    if (size % 16 != 0) {
      fill_block(size - 16);
    }
  }
}

// normal_ into out[0 .. size) with `transform`'s Box-Muller step.
template <typename scalar_t>
void fill_normal_as(
    FloatTransform transform,
    scalar_t* out,
    int64_t size,
    double mean,
    double std,
    at::CPUGeneratorImpl* generator) {
  using opmath_t = at::opmath_type<scalar_t>;
  if constexpr (std::is_same_v<opmath_t, float>) {
    if (transform == FloatTransform::kAvx2) {
      const float m = static_cast<float>(mean);
      const float s = static_cast<float>(std);
      fill_normal(out, size, generator, [m, s](float* values) { normal_fill_16_avx2(values, m, s); });
      return;
    }
  }
  const at::native::templates::cpu::NormalFill16<opmath_t> transform16(
      static_cast<opmath_t>(mean), static_cast<opmath_t>(std));
  fill_normal(out, size, generator, [&transform16](opmath_t* values) { transform16(values); });
}

// The transform for this machine's capability, if it gives CPU's float and
// double values (checked once); kUnknown otherwise.
FloatTransform cpu_float_transform() {
  static const FloatTransform transform = [] {
    const FloatTransform candidate = capability_transform();
    auto same_as_cpu = [candidate](auto zero) {
      using scalar_t = decltype(zero);
      return fills_like_cpu<scalar_t>(
          [](at::Tensor& t, const at::Generator& g) { at::native::normal_(t, 0.5, 2.0, g); },
          [candidate](scalar_t* out, int64_t size, at::CPUGeneratorImpl* g) {
            fill_normal_as(candidate, out, size, 0.5, 2.0, g);
          });
    };
    if (candidate == FloatTransform::kUnknown || !same_as_cpu(0.0f) || !same_as_cpu(0.0)) {
      return FloatTransform::kUnknown;
    }
    return candidate;
  }();
  return transform;
}

} // namespace

bool uniform_fill_applies(const at::Tensor& self) {
  return is_floating(self) && self.numel() > 0 && self.is_contiguous();
}

bool random_fill_applies(const at::Tensor& self) {
  switch (self.scalar_type()) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kBool:
      return self.numel() > 0 && self.is_contiguous();
    default:
      return uniform_fill_applies(self);
  }
}

void uniform_fill(const at::Tensor& self, void* data, at::CPUGeneratorImpl* generator) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "uniform_", [&] {
    at::uniform_real_distribution<at::opmath_type<scalar_t>> uniform(0, 1);
    const auto one = static_cast<scalar_t>(1.0);
    draw_in_memory_order(static_cast<scalar_t*>(data), self.numel(), generator, [&] {
      // As CPU's kernel: a value the cast rounded up to 1 becomes 0.
      const auto value = static_cast<scalar_t>(uniform(generator));
      return value == one ? static_cast<scalar_t>(0.0) : value;
    });
  });
}

void random_fill(const at::Tensor& self, void* data, at::CPUGeneratorImpl* generator) {
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, self.scalar_type(), "random_", [&] {
    draw_in_memory_order(static_cast<scalar_t*>(data), self.numel(), generator, [generator] {
      at::uniform_int_distribution<scalar_t> random;
      return random(generator);
    });
  });
}

bool bernoulli_fill_applies(const at::Tensor& self) {
  // CPU's kernel is the template's loop unless torch was built with MKL and
  // runs on an Intel CPU: then it draws with MKL's VSL routines, other numbers.
  static const bool cpu_runs_template = fills_like_cpu<float>(
      [](at::Tensor& t, const at::Generator& g) { at::native::bernoulli_(t, 0.37, g); },
      [](float* out, int64_t size, at::CPUGeneratorImpl* g) { fill_bernoulli(out, size, 0.37, g); });
  return random_fill_applies(self) && cpu_runs_template;
}

void bernoulli_fill(const at::Tensor& self, void* data, double p, at::CPUGeneratorImpl* generator) {
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, self.scalar_type(), "bernoulli_", [&] {
    fill_bernoulli(static_cast<scalar_t*>(data), self.numel(), p, generator);
  });
}

bool randperm_fill_applies(const at::Tensor& out, int64_t n) {
  // Larger n take CPU's other shuffle (random64, no initialization pass).
  constexpr int64_t kSmallShuffle = std::numeric_limits<uint32_t>::max() / 20;
  // Checked on the first call the loop would take, not on every randperm.
  auto cpu_shuffles_so = [] {
    static const bool same = fills_like_cpu<int64_t>(
        [](at::Tensor& t, const at::Generator& g) { at::native::randperm_out_cpu(t.numel(), g, t); },
        [](int64_t* data, int64_t size, at::CPUGeneratorImpl* g) { fill_randperm(data, size, 1, g); });
    return same;
  };
  return (out.scalar_type() == at::kLong || out.scalar_type() == at::kInt) && out.dim() == 1 &&
      out.size(0) == n && n > 0 && n < kSmallShuffle && cpu_shuffles_so();
}

void randperm_fill(const at::Tensor& out, void* data, int64_t n, at::CPUGeneratorImpl* generator) {
  AT_DISPATCH_INDEX_TYPES(out.scalar_type(), "randperm", [&] {
    fill_randperm(static_cast<index_t*>(data), n, out.stride(0), generator);
  });
}

bool normal_fill_applies(const at::Tensor& self) {
  return is_floating(self) && self.numel() >= 16 && self.is_contiguous() &&
      cpu_float_transform() != FloatTransform::kUnknown;
}

void normal_fill(const at::Tensor& self, void* data, double mean, double std, at::CPUGeneratorImpl* generator) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "normal_", [&] {
    fill_normal_as(cpu_float_transform(), static_cast<scalar_t*>(data), self.numel(), mean, std, generator);
  });
}

void uniform_kernel(
    at::TensorIteratorBase& iter,
    const double from,
    const double to,
    std::optional<at::Generator> generator) {
  if (from != 0.0 || to != 1.0) {
    // value·(to − from) + from: CPU's kernel, built for this machine's vector
    // instructions, may fuse it into one rounding; this file, built for the
    // baseline, would round twice. Over [0, 1) the product and sum are exact.
    const at::Generator& cpu = cpu_generator_for(generator, iter.device().index(), "aten::uniform_");
    run_kernel_inline(iter.device().index(), [&] { run_cpu_stub(at::native::uniform_stub, iter, from, to, cpu); });
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
