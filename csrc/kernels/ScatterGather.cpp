// impl() of gather and scatter (src and value; `structured: impl:` in the
// yaml), after torch's meta() (at::meta::structured_gather, ...) checked the
// dtypes, shapes and overlaps and sized the output.
//
// CPU's kernels build a TensorIterator over the dimensions other than `dim`
// and loop along `dim` inside it. On small operands (fewer elements than
// at::internal::GRAIN_SIZE, so CPU's kernel runs serially) these copy the
// elements on kernel addresses instead, without the iterator: a gather or a
// scatter only moves elements, so the result is CPU's bit for bit as long as
// writes to one position keep CPU's order. Both run as a kernel launched on
// the stream (launch_out_kernel), which decides on the indices. Within a slice along `dim` CPU
// writes in increasing position along `dim`, and slices never share a
// position; the loop here walks `index` in row-major order, which keeps that
// order. Every index is checked before anything is written; if one is out of
// bounds, CPU's kernel runs so that its error names the index CPU finds first.
//
// Every other case runs CPU's own kernel in that kernel (an out= that partly
// overlaps `self` in the calling thread, where CPU's overlap error raises): larger
// operands (CPU's kernel parallelizes), dtypes CPU's kernel may not support
// (its error then), 0-dim operands, or operands on other devices (CpuKernelCall raises as for CUDA).
#include <cstring>

#include <ATen/MemoryOverlap.h>
#include <c10/util/string_view.h> // before scatter_cpu_dispatch.h, which uses it
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/gather_cpu_dispatch.h>
#include <ATen/ops/scatter_cpu_dispatch.h>
#include <c10/util/complex.h>

#include "OpenRegNativeFunctions.h"
#include "operators/cpu/OpenRegCpuKernelCall.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::native {
namespace {

// The dtypes CPU's scatter/gather kernel dispatches on ("scatter_gather_tensor_cpu").
bool kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kHalf:
    case at::kFloat:
    case at::kDouble:
    case at::kComplexFloat:
    case at::kComplexDouble:
    case at::kBool:
    case at::kBFloat16:
      return true;
    default:
      return false;
  }
}

// Whether the elements can be moved here (if their indices are in bounds,
// which the kernel checks): small, on `out`'s device, and of `self`'s
// dimensionality (at least one dimension).
bool moves_here(const at::Tensor& out, const at::Tensor& self, const at::Tensor& index, const at::Tensor* src) {
  const c10::Device device = out.device();
  const auto small = [](const at::Tensor& t) { return t.numel() < at::internal::GRAIN_SIZE; };
  return self.dim() > 0 && index.dim() == self.dim() && kernel_dtype(self.scalar_type()) && small(index) &&
      small(out) && self.device() == device && index.device() == device &&
      (src == nullptr || (src->device() == device && src->dim() == self.dim()));
}

// Calls f(i, s, o) for each position of `index`, in row-major order of its
// shape, with the offsets (in elements) of that position in `index` (i), in a
// tensor of `self_strides` with the coordinate along `dim` left out (s: a
// gather or scatter replaces it by the index; dim -1 leaves out none), and in
// a tensor of `other_strides` (o).
template <typename F>
void for_each_position(const at::Tensor& index, at::IntArrayRef self_strides, at::IntArrayRef other_strides,
                       int64_t dim, F&& f) {
  const int64_t ndim = index.dim();
  const at::IntArrayRef sizes = index.sizes();
  const at::IntArrayRef index_strides = index.strides();
  c10::SmallVector<int64_t, 8> counter(static_cast<size_t>(ndim), 0);
  int64_t at_index = 0;
  int64_t at_self = 0;  // without `dim`
  int64_t at_other = 0; // src or out, with `dim`
  const int64_t count = index.numel();
  for (int64_t n = 0; n < count; ++n) {
    f(at_index, at_self, at_other);
    for (int64_t d = ndim - 1; d >= 0; --d) {
      const int64_t self_step = d == dim ? 0 : self_strides[d];
      if (++counter[d] < sizes[d]) {
        at_index += index_strides[d];
        at_self += self_step;
        at_other += other_strides[d];
        break;
      }
      at_index -= index_strides[d] * (sizes[d] - 1);
      at_self -= self_step * (sizes[d] - 1);
      at_other -= other_strides[d] * (sizes[d] - 1);
      counter[d] = 0;
    }
  }
}

template <typename index_t>
bool in_bounds(const at::Tensor& index, int64_t size) {
  const auto* data = static_cast<const index_t*>(orKernelAddress(index.const_data_ptr()));
  bool ok = true;
  for_each_position(index, index.strides(), index.strides(), -1, [&](int64_t i, int64_t, int64_t) {
    ok = ok && data[i] >= 0 && data[i] < size;
  });
  return ok;
}

bool indices_in_bounds(const at::Tensor& index, int64_t size) {
  return index.scalar_type() == at::kLong ? in_bounds<int64_t>(index, size) : in_bounds<int32_t>(index, size);
}

// An element of `size` bytes, copied as one value.
template <size_t size>
struct Element {
  alignas(size < 16 ? size : 16) unsigned char bytes[size];
};

template <typename F>
void with_element_type(size_t element_size, F&& f) {
  switch (element_size) {
    case 1:
      return f(Element<1>{});
    case 2:
      return f(Element<2>{});
    case 4:
      return f(Element<4>{});
    case 8:
      return f(Element<8>{});
    case 16:
      return f(Element<16>{});
    default:
      TORCH_INTERNAL_ASSERT(false, "openreg scatter/gather: unexpected element size ", element_size);
  }
}

// out[p] = self[p with p[dim] = index[p]], for every position p of index.
template <typename index_t>
void gather_elements(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& out) {
  const auto* idx = static_cast<const index_t*>(orKernelAddress(index.const_data_ptr()));
  const int64_t dim_stride = self.stride(dim);
  with_element_type(self.element_size(), [&](auto element) {
    using T = decltype(element);
    const auto* src = static_cast<const T*>(orKernelAddress(self.const_data_ptr()));
    T* dst = static_cast<T*>(orKernelAddress(out.mutable_data_ptr()));
    for_each_position(index, self.strides(), out.strides(), dim, [&](int64_t i, int64_t s, int64_t o) {
      dst[o] = src[s + idx[i] * dim_stride];
    });
  });
}

// out[p with p[dim] = index[p]] = value(p), for every position p of index in
// row-major order; `value(T*, offset)` writes one element.
template <typename index_t, typename T, typename Value>
void scatter_elements(const at::Tensor& out, int64_t dim, const at::Tensor& index, at::IntArrayRef value_strides,
                      Value&& value) {
  const auto* idx = static_cast<const index_t*>(orKernelAddress(index.const_data_ptr()));
  const int64_t dim_stride = out.stride(dim);
  T* dst = static_cast<T*>(orKernelAddress(out.mutable_data_ptr()));
  for_each_position(index, out.strides(), value_strides, dim, [&](int64_t i, int64_t o, int64_t v) {
    value(dst + o + idx[i] * dim_stride, v);
  });
}

// out = self, element by element (out has self's sizes and dtype, and does not
// overlap it).
void copy_elements(const at::Tensor& self, const at::Tensor& out) {
  if (self.is_contiguous() && out.is_contiguous()) {
    std::memcpy(orKernelAddress(out.mutable_data_ptr()), orKernelAddress(self.const_data_ptr()), self.nbytes());
    return;
  }
  with_element_type(self.element_size(), [&](auto element) {
    using T = decltype(element);
    const auto* src = static_cast<const T*>(orKernelAddress(self.const_data_ptr()));
    T* dst = static_cast<T*>(orKernelAddress(out.mutable_data_ptr()));
    // self's own shape as the "index": every position, none replaced.
    for_each_position(self, self.strides(), out.strides(), -1, [&](int64_t s, int64_t, int64_t o) {
      dst[o] = src[s];
    });
  });
}

// Whether out= shares memory with self without being it: CPU's impl copies
// self into out with copy_, whose overlap checks decide, in the calling thread
// (run_cpu_out_kernel).
bool overlaps_self(const at::Tensor& self, const at::Tensor& out) {
  return !self.is_same(out) && at::get_overlap_status(self, out) != at::MemOverlapStatus::No;
}

// In a kernel: whether the scatter's indices are in bounds, and if so `out`
// holds `self`'s values afterwards, as CPU's impl copies them before its
// kernel runs (then the elements move here; otherwise CPU's kernel runs and
// raises its error).
bool prepare_scatter(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& out) {
  if (!indices_in_bounds(index, out.size(dim))) {
    return false;
  }
  if (!self.is_same(out)) {
    copy_elements(self, out);
  }
  return true;
}

} // namespace

void gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparse_grad, const at::Tensor& out) {
  const NamedInput inputs[] = {{&self, "self"}, {&index, "index"}};
  if (index.numel() == 0) {
    check_out_operands("aten::gather.out", inputs, out);
    return;
  }
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());
  const bool here = moves_here(out, self, index, nullptr);
  static SeenDtypes seen;
  launch_out_kernel<kDeviceTensors>("aten::gather.out", seen, inputs, out, [=](auto& t) {
    const at::Tensor &o = t[0], &s = t[1], &i = t[2];
    if (here && indices_in_bounds(i, s.size(d))) {
      AT_DISPATCH_INDEX_TYPES(i.scalar_type(), "openreg_gather", [&] { gather_elements<index_t>(s, d, i, o); });
    } else {
      auto c = cpu_tensors_of(t);
      at::cpu::gather_outf(c[1], dim, c[2], sparse_grad, c[0]);
    }
  });
}

void scatter_src_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                     const at::Tensor& out) {
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());
  if (overlaps_self(self, out)) {
    run_cpu_out_kernel("aten::scatter.src_out", {{&self, "self"}, {&index, "index"}, {&src, "src"}}, out,
                       [&](at::Tensor& out_alias, CpuKernelCall& call) {
                         at::cpu::scatter_outf(call.alias(self), dim, call.alias(index), call.alias(src), out_alias);
                       });
    return;
  }
  const bool here = moves_here(out, self, index, &src);
  static SeenDtypes seen;
  launch_out_kernel<kDeviceTensors>(
      "aten::scatter.src_out", seen, {{&self, "self"}, {&index, "index"}, {&src, "src"}}, out, [=](auto& t) {
        const at::Tensor &o = t[0], &s = t[1], &i = t[2], &values = t[3];
        if (!here || !prepare_scatter(s, d, i, o)) {
          auto c = cpu_tensors_of(t);
          at::cpu::scatter_outf(c[1], dim, c[2], c[3], c[0]);
          return;
        }
        with_element_type(o.element_size(), [&](auto element) {
          using T = decltype(element);
          const auto* from = static_cast<const T*>(orKernelAddress(values.const_data_ptr()));
          AT_DISPATCH_INDEX_TYPES(i.scalar_type(), "openreg_scatter", [&] {
            scatter_elements<index_t, T>(o, d, i, values.strides(), [&](T* at, int64_t v) { *at = from[v]; });
          });
        });
      });
}

void scatter_value_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value,
                       const at::Tensor& out) {
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());
  if (overlaps_self(self, out)) {
    run_cpu_out_kernel("aten::scatter.value_out", {{&self, "self"}, {&index, "index"}}, out,
                       [&](at::Tensor& out_alias, CpuKernelCall& call) {
                         at::cpu::scatter_outf(call.alias(self), dim, call.alias(index), value, out_alias);
                       });
    return;
  }
  const bool here = moves_here(out, self, index, nullptr);
  static SeenDtypes seen;
  launch_out_kernel<kDeviceTensors>("aten::scatter.value_out", seen, {{&self, "self"}, {&index, "index"}}, out, [=](auto& t) {
    const at::Tensor &o = t[0], &s = t[1], &i = t[2];
    if (!here || !prepare_scatter(s, d, i, o)) {
      auto c = cpu_tensors_of(t);
      at::cpu::scatter_outf(c[1], dim, c[2], value, c[0]);
      return;
    }
    AT_DISPATCH_ALL_TYPES_AND_COMPLEX_AND3(at::kBool, at::kHalf, at::kBFloat16, o.scalar_type(), "openreg_scatter_value", [&] {
      const scalar_t v = value.to<scalar_t>(); // CPU's conversion and its overflow error
      AT_DISPATCH_INDEX_TYPES(i.scalar_type(), "openreg_scatter_value", [&] {
        scatter_elements<index_t, scalar_t>(o, d, i, i.strides(), [&](scalar_t* at, int64_t) { *at = v; });
      });
    });
  });
}

} // namespace openreg::native
