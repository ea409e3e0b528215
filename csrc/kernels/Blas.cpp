// impl() of mm, addmm, bmm and baddbmm (`structured: impl:` in the yaml),
// after torch's meta() (at::meta::structured_mm, ...) checked the shapes and
// dtypes and sized the output; matmul and linear reach them.
//
// CPU's impls hand BLAS the operands' data pointers or index them directly,
// which CPU code cannot do on openreg's device memory. These do what CPU's
// do on kernel addresses where that is simple enough to follow exactly, so
// results are CPU's bit for bit (tests/test_structured_impls.py compares
// them):
// - mm, addmm in float and double: the layout choices of CPU's impl and the
//   BLAS routine it calls then (sgemm_/dgemm_, which libtorch_cpu exports);
// - bmm, baddbmm with small matrices: the loops of CPU's small-product kernel.
// Every other case runs CPU's own kernel on CPU aliases (CpuKernelCall): other
// dtypes, conjugate or negative views, operands BLAS cannot read in place (CPU
// copies those first), an empty contraction, larger batched products (BLAS or
// oneDNN), a reduced-precision float32 matmul mode
// (torch.backends.mkldnn.matmul.fp32_precision), or operands on other devices
// (CpuKernelCall accepts a 0-dim CPU bias and rejects the rest, as for CUDA).
#include <algorithm>
#include <climits>
#include <optional>

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/baddbmm_native.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>

#include "OpenRegNativeFunctions.h"
#include "operators/cpu/OpenRegCpuKernelCall.h"
#include "operators/OpenRegLaunch.h"
#include "runtime/OpenRegRuntime.h"

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
}

namespace openreg::native {
namespace {

// One column-major BLAS call: c (m×n) = alpha·op(a)·op(b) + beta·c.
struct Gemm {
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool swap = false; // a is m2 and b is m1
};

// How BLAS reads a `rows`×`cols` matrix with strides (row_stride,
// col_stride) in column-major order: as it is (false), transposed (true), or
// not at all (a copy would be needed).
std::optional<bool> blas_layout(int64_t row_stride, int64_t col_stride, int64_t rows, int64_t cols) {
  if (row_stride == 1 && col_stride >= std::max<int64_t>(1, rows)) {
    return false;
  }
  if (col_stride == 1 && row_stride >= std::max<int64_t>(1, cols)) {
    return true;
  }
  return std::nullopt;
}

// The BLAS call for out = beta·out + alpha·(m1 @ m2), as CPU's impl shapes
// it, or nothing where CPU's impl would copy an operand first.
std::optional<Gemm> plan(const at::Tensor& out, const at::Tensor& m1, const at::Tensor& m2) {
  const auto rows = out.sizes();
  const auto strides = out.strides();
  Gemm g;
  // A row-major output is the column-major transpose: swap the operands.
  bool swap = false;
  if (strides[0] == 1 && (rows[1] == 1 || strides[1] >= std::max<int64_t>(1, rows[0]))) {
    swap = false;
  } else if (strides[1] == 1 && (rows[0] == 1 || strides[0] >= std::max<int64_t>(1, rows[1]))) {
    swap = true;
  } else {
    return std::nullopt;
  }
  const at::Tensor& a = swap ? m2 : m1;
  const at::Tensor& b = swap ? m1 : m2;
  const int r = swap ? 1 : 0; // the dimension of a and b that BLAS walks down a column
  const int c = 1 - r;
  g.m = rows[r];
  g.n = rows[c];
  g.k = a.size(c);
  const std::optional<bool> ta = blas_layout(a.stride(r), a.stride(c), g.m, g.k);
  const std::optional<bool> tb = blas_layout(b.stride(r), b.stride(c), g.k, g.n);
  if (!ta || !tb) {
    return std::nullopt;
  }
  g.transpose_a = *ta;
  g.transpose_b = *tb;
  g.lda = a.stride(*ta == swap ? 1 : 0);
  g.ldb = b.stride(*tb == swap ? 1 : 0);
  g.ldc = strides[swap ? 0 : 1];
  g.swap = swap;
  // Leading dimensions of degenerate matrices, as cpublas normalizes them.
  if (g.n == 1) {
    g.ldc = g.m;
  }
  if (g.transpose_a ? g.m == 1 : g.k == 1) {
    g.lda = g.transpose_a ? g.k : g.m;
  }
  if (g.transpose_b ? g.k == 1 : g.n == 1) {
    g.ldb = g.transpose_b ? g.n : g.k;
  }
  // cpublas hands BLAS only what fits its int and its leading-dimension rules.
  const bool fits = std::max({g.m, g.n, g.k, g.lda, g.ldb, g.ldc}) <= INT_MAX &&
      g.lda >= std::max<int64_t>(1, g.transpose_a ? g.k : g.m) &&
      g.ldb >= std::max<int64_t>(1, g.transpose_b ? g.n : g.k) && g.ldc >= std::max<int64_t>(1, g.m);
  if (!fits) {
    return std::nullopt;
  }
  return g;
}

// dst = src for two matrices of one shape and dtype, any strides. The loop
// walks dst's contiguous dimension innermost; where src is contiguous along it
// too (a bias row broadcast down the rows is), each line is one std::copy_n.
template <class T>
void copy_matrix(const at::Tensor& src, const at::Tensor& dst) {
  const T* from = static_cast<const T*>(orKernelAddress(src.const_data_ptr()));
  T* to = static_cast<T*>(orKernelAddress(dst.mutable_data_ptr()));
  const bool by_rows = dst.stride(1) == 1 || dst.size(1) == 1;
  const int outer = by_rows ? 0 : 1;
  const int inner = 1 - outer;
  const int64_t lines = dst.size(outer), length = dst.size(inner);
  const int64_t from_line = src.stride(outer), from_step = src.stride(inner);
  const int64_t to_line = dst.stride(outer), to_step = dst.stride(inner);
  for (int64_t i = 0; i < lines; ++i) {
    const T* line = from + i * from_line;
    T* out = to + i * to_line;
    if (from_step == 1 && to_step == 1) {
      std::copy_n(line, length, out);
      continue;
    }
    for (int64_t j = 0; j < length; ++j) {
      out[j * to_step] = line[j * from_step];
    }
  }
}

// The BLAS call, after copying `bias` (if defined) into out.
template <class T, class F>
void run(const Gemm& g, F blas, const at::Tensor& bias, const at::Tensor& out, const at::Tensor& m1,
         const at::Tensor& m2, const at::Scalar& alpha_, const at::Scalar& beta_) {
  if (bias.defined()) {
    copy_matrix<T>(bias, out);
  }
  const at::Tensor& a = g.swap ? m2 : m1;
  const at::Tensor& b = g.swap ? m1 : m2;
  const char transa = g.transpose_a ? 't' : 'n';
  const char transb = g.transpose_b ? 't' : 'n';
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb), ldc = static_cast<int>(g.ldc);
  const T alpha = alpha_.to<T>();
  const T beta = beta_.to<T>();
  blas(&transa, &transb, &m, &n, &k, &alpha, static_cast<const T*>(orKernelAddress(a.const_data_ptr())), &lda,
       static_cast<const T*>(orKernelAddress(b.const_data_ptr())), &ldb, &beta,
       static_cast<T*>(orKernelAddress(out.mutable_data_ptr())), &ldc);
}

bool blas_dtype(const at::Tensor& out) {
  if (out.scalar_type() == at::kDouble) {
    return true;
  }
  if (out.scalar_type() != at::kFloat) {
    return false;
  }
  // CPU's float gemm goes through oneDNN in a reduced-precision mode.
  const at::Float32Precision precision =
      at::globalContext().float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
  return precision != at::Float32Precision::BF16 && precision != at::Float32Precision::TF32;
}

bool plain(const at::Tensor& t, const at::Tensor& out) {
  return t.device() == out.device() && t.scalar_type() == out.scalar_type() && !t.is_conj() && !t.is_neg();
}

// out = beta·self + alpha·(m1 @ m2) on kernel addresses; false (nothing done)
// where CPU's kernel has to run instead. self has out's shape.
bool blas_addmm(
    const at::Tensor& out,
    const at::Tensor& self,
    const at::Tensor& m1,
    const at::Tensor& m2,
    const at::Scalar& beta,
    const at::Scalar& alpha) {
  if (!blas_dtype(out) || !plain(self, out) || !plain(m1, out) || !plain(m2, out) || !plain(out, out) ||
      m1.size(1) == 0) {
    return false;
  }
  const std::optional<Gemm> g = plan(out, m1, m2);
  if (!g) {
    return false;
  }
  const bool add = beta.toComplexDouble() != 0.0 && !self.is_same(out);
  // A small bias (often a broadcast row) is copied here (copy_matrix);
  // copy_ would build CPU aliases for it. A large one, or one sharing
  // memory with the output, goes through copy_.
  const bool small = out.numel() < at::internal::GRAIN_SIZE && !self.storage().is_alias_of(out.storage());
  if (add && !small) {
    out.copy_(self);
  }
  static SeenDtypes seen;
  const at::Tensor no_bias;
  launch_operands_kernel<kDeviceTensors>(
      out.device().index(), "openreg::native::blas_addmm", seen, std::array<const at::TensorBase*, 4>{&out, &m1, &m2, add && small ? &self : &no_bias},
      [g = *g, alpha, beta](const std::array<at::Tensor, 4>& t) {
        if (t[0].scalar_type() == at::kFloat) {
          run<float>(g, sgemm_, t[3], t[0], t[1], t[2], alpha, beta);
        } else {
          run<double>(g, dgemm_, t[3], t[0], t[1], t[2], alpha, beta);
        }
      });
  return true;
}

// Batched products of fewer than this many multiply-adds per matrix CPU
// computes with its own loops (larger ones go to BLAS or oneDNN).
constexpr int64_t kSmallBatchedProduct = 400;

// out[b] = m1[b] @ m2[b] (bmm), or beta·out[b] + alpha·(m1[b] @ m2[b]) with
// out already holding the bias (meta() copied it), by the loops and in the
// precision (at::opmath_type) of CPU's kernel for small products, which is
// what makes the results CPU's bit for bit.
template <class T, bool bmm>
void small_batched(const at::Tensor& out, const at::Tensor& m1, const at::Tensor& m2, const at::Scalar& beta_,
                   const at::Scalar& alpha_) {
  using acc_t = at::opmath_type<T>;
  const acc_t alpha = alpha_.to<acc_t>();
  const acc_t beta = beta_.to<acc_t>();
  T* r = static_cast<T*>(orKernelAddress(out.mutable_data_ptr()));
  const T* x = static_cast<const T*>(orKernelAddress(m1.const_data_ptr()));
  const T* y = static_cast<const T*>(orKernelAddress(m2.const_data_ptr()));
  const int64_t rows = out.size(1), cols = out.size(2), inner = m1.size(2);
  const auto rs = out.strides(), xs = m1.strides(), ys = m2.strides();
  const int64_t grain = std::max<int64_t>(at::internal::GRAIN_SIZE / (rows * cols * inner), 1);
  at::parallel_for(0, out.size(0), grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          acc_t sum = 0;
          for (int64_t k = 0; k < inner; ++k) {
            sum += static_cast<acc_t>(x[b * xs[0] + i * xs[1] + k * xs[2]]) *
                static_cast<acc_t>(y[b * ys[0] + k * ys[1] + j * ys[2]]);
          }
          T& dst = r[b * rs[0] + i * rs[1] + j * rs[2]];
          if (bmm) {
            dst = sum;
          } else if (beta == acc_t{0}) {
            dst = alpha * sum;
          } else {
            dst = static_cast<acc_t>(dst) * beta + alpha * sum;
          }
        }
      }
    }
  });
}

// out = bmm or baddbmm on kernel addresses; false (nothing done) where CPU's
// kernel has to run instead: BLAS- or oneDNN-sized products, half precision
// (oneDNN may take those), conjugate views, an empty contraction.
template <bool bmm>
bool small_batched_product(
    const at::Tensor& out,
    const at::Tensor& m1,
    const at::Tensor& m2,
    const at::Scalar& beta,
    const at::Scalar& alpha) {
  const at::ScalarType dtype = out.scalar_type();
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  if (half || !plain(m1, out) || !plain(m2, out) || !plain(out, out) || m1.size(2) == 0 ||
      (dtype == at::kFloat && !blas_dtype(out)) ||
      m1.size(2) * m1.size(1) * m2.size(2) >= kSmallBatchedProduct) {
    return false;
  }
  switch (dtype) { // AT_DISPATCH_ALL_TYPES_AND_COMPLEX's
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kFloat: case at::kDouble: case at::kComplexFloat: case at::kComplexDouble:
      break;
    default:
      return false;
  }
  static SeenDtypes seen;
  launch_operands_kernel<kDeviceTensors>(
      out.device().index(), "openreg::native::small_batched_product", seen, std::array<const at::TensorBase*, 3>{&out, &m1, &m2},
      [beta, alpha](const std::array<at::Tensor, 3>& t) {
        AT_DISPATCH_ALL_TYPES_AND_COMPLEX(t[0].scalar_type(), "openreg_small_batched", [&] {
          small_batched<scalar_t, bmm>(t[0], t[1], t[2], beta, alpha);
        });
      });
  return true;
}

// CPU's baddbmm impl without its meta(): at::cpu::baddbmm_out would run meta()
// again on the CPU aliases, and that meta() copies self into the output a
// second time (a second pass over the output's memory on large inputs). The
// impl reads only its arguments.
struct BaddbmmImpl final : at::native::structured_baddbmm_out_cpu {
  const at::Tensor& maybe_get_output(int64_t /*output_idx*/) override {
    TORCH_INTERNAL_ASSERT(false, "openreg's baddbmm calls CPU's impl() only, which sets no output");
  }
};

} // namespace

void mm_out(const at::Tensor& self, const at::Tensor& mat2, const at::Tensor& out) {
  const NamedInput inputs[] = {{&self, "self"}, {&mat2, "mat2"}};
  if (out.numel() == 0) {
    check_out_operands("aten::mm", inputs, out);
    return;
  }
  if (blas_addmm(out, out, self, mat2, 0, 1)) {
    return;
  }
  static SeenDtypes seen;
  launch_out_kernel<kCpuTensors>("aten::mm", seen, inputs, out, [](auto& t) {
    at::cpu::mm_out(t[0], t[1], t[2]);
  });
}

void addmm_out(
    const at::Tensor& self,
    const at::Tensor& mat1,
    const at::Tensor& mat2,
    const at::Scalar& beta,
    const at::Scalar& alpha,
    const at::Tensor& out) {
  const NamedInput inputs[] = {{&self, "self"}, {&mat1, "mat1"}, {&mat2, "mat2"}};
  if (out.numel() == 0) {
    check_out_operands("aten::addmm", inputs, out);
    return;
  }
  const c10::MaybeOwned<at::Tensor> bias = at::expand_size(self, {mat1.size(0), mat2.size(1)}, "addmm_out");
  if (blas_addmm(out, *bias, mat1, mat2, beta, alpha)) {
    return;
  }
  static SeenDtypes seen;
  launch_out_kernel<kCpuTensors>(
      "aten::addmm", seen, inputs, out, [beta, alpha](auto& t) {
        at::cpu::addmm_out(t[0], t[1], t[2], t[3], beta, alpha);
      });
}

void bmm_out(const at::Tensor& self, const at::Tensor& mat2, const at::Tensor& out) {
  const NamedInput inputs[] = {{&self, "self"}, {&mat2, "mat2"}};
  if (out.numel() == 0) {
    check_out_operands("aten::bmm", inputs, out);
    return;
  }
  if (small_batched_product<true>(out, self, mat2, 0, 1)) {
    return;
  }
  static SeenDtypes seen;
  launch_out_kernel<kCpuTensors>("aten::bmm", seen, inputs, out, [](auto& t) {
    at::cpu::bmm_out(t[0], t[1], t[2]);
  });
}

void baddbmm_out(
    const at::Tensor& self,
    const at::Tensor& batch1,
    const at::Tensor& batch2,
    const at::Scalar& beta,
    const at::Scalar& alpha,
    const at::Tensor& out) {
  // meta() has copied self into out unless beta is 0 (and out is not self).
  // The small product reads out (holding self) and the batches: a self on
  // another device is checked here, as an empty result is.
  const NamedInput inputs[] = {{&self, "self"}, {&batch1, "batch1"}, {&batch2, "batch2"}};
  const bool empty = out.numel() == 0;
  if (empty || self.device() != out.device()) {
    check_out_operands("aten::baddbmm", inputs, out);
  }
  if (empty || small_batched_product<false>(out, batch1, batch2, beta, alpha)) {
    return;
  }
  static SeenDtypes seen;
  launch_out_kernel<kCpuTensors>(
      "aten::baddbmm", seen, inputs, out, [beta, alpha](auto& t) { BaddbmmImpl().impl(t[1], t[2], t[3], beta, alpha, t[0]); });
}

} // namespace openreg::native
