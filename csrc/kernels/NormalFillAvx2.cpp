// CPU's normal_ kernel, for float, half and bfloat16 tensors of 16 or more
// contiguous elements, draws uniforms and transforms them 16 at a time
// (NormalFill16 in ATen/native/cpu/DistributionTemplates.h). On x86 machines
// with AVX2 or AVX-512 it runs the AVX2 build of that kernel (torch registers
// no AVX-512 one), whose transform uses the vector log and sincos of
// ATen/native/cpu/avx_mathfun.h. Those round differently from libm's, so
// openreg's normal_ (Random.cpp) needs the same vector code for the same
// numbers as CPU from the same seed.
//
// The extension is built for baseline x86-64, so only this file's functions
// are compiled for AVX2 and FMA (the flags of torch's AVX2 kernels), with
// GCC's target pragma; with other compilers there is no such function, and
// normal_ runs CPU's kernel on a CPU alias. The file includes nothing but the
// intrinsics and avx_mathfun.h: inline functions of other headers, compiled
// here for AVX2, could otherwise be the copy the linker keeps for the whole
// library. avx_mathfun.h's functions are hidden, so no other library resolves
// to them.
#include "kernels/NormalFillAvx2.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC visibility push(hidden)
#define CPU_CAPABILITY_AVX2
#include <ATen/native/cpu/avx_mathfun.h>
#undef CPU_CAPABILITY_AVX2
#pragma GCC visibility pop

namespace openreg::native {
namespace {
constexpr double kPi = 3.14159265358979323846;
} // namespace

bool have_normal_fill_16_avx2() {
  return true;
}

void normal_fill_16_avx2(float* data, float mean, float std) {
  // Box-Muller: radius sqrt(-2 log(1 - u1)), angle 2π u2, in float lanes.
  const __m256 one_minus_u1 = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_loadu_ps(data));
  const __m256 u2 = _mm256_loadu_ps(data + 8);
  const __m256 radius = _mm256_sqrt_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f), log256_ps(one_minus_u1)));
  const __m256 angle = _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(2.0 * kPi)), u2);
  __m256 sin_angle;
  __m256 cos_angle;
  sincos256_ps(angle, &sin_angle, &cos_angle);
  const __m256 mean_v = _mm256_set1_ps(mean);
  const __m256 std_v = _mm256_set1_ps(std);
  _mm256_storeu_ps(data, _mm256_fmadd_ps(_mm256_mul_ps(radius, cos_angle), std_v, mean_v));
  _mm256_storeu_ps(data + 8, _mm256_fmadd_ps(_mm256_mul_ps(radius, sin_angle), std_v, mean_v));
}

} // namespace openreg::native

#pragma GCC pop_options

#else

#include <c10/util/Exception.h>

namespace openreg::native {

bool have_normal_fill_16_avx2() {
  return false;
}

void normal_fill_16_avx2(float*, float, float) {
  TORCH_INTERNAL_ASSERT(false, "normal_fill_16_avx2 is built for x86-64 only");
}

} // namespace openreg::native

#endif
