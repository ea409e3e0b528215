// The Box-Muller step of CPU's normal_ kernel as torch builds it for x86
// machines with AVX2 (Random.cpp picks it; NormalFillAvx2.cpp says why).
#pragma once

namespace openreg::native {

// Whether this build has normal_fill_16_avx2 (x86-64, built with GCC).
bool have_normal_fill_16_avx2();

// Turns 16 uniform draws in [0, 1) at `data` into 16 normal values with the
// given mean and standard deviation: data[j] and data[j + 8] are the cosine
// and sine halves of one pair. The caller checks that the CPU runs AVX2.
void normal_fill_16_avx2(float* data, float mean, float std);

} // namespace openreg::native
