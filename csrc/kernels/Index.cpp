// Advanced indexing: index_stub (`x[indices]`), behind torch's structured
// index_out, whose meta() builds the iterator (output, the source restrided to
// 0-stride over the indexed dimensions, then the int64 index tensors), and
// index_put_stub (`x[indices] = v`), behind torch's device-generic
// _index_put_impl_, which builds the same kind of iterator over `self`
// (accumulating, or in deterministic mode, CPU's kernel runs instead: below).
// Both move CPU indices to the device first, as for CUDA.
//
// The operands have different dtypes on purpose, but the iterator still
// reports a common dtype, so the generic `cpu_kernel: true` route
// (AsCpuIterator) would cast the indices to the source's dtype. Here only the
// addresses change before torch's CPU kernel runs.
#include <cstring>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/IndexKernel.h>
#include <ATen/ops/_index_put_impl_cpu_dispatch.h>
#include <ATen/ops/_index_put_impl_native.h>
#include <ATen/ops/_index_put_impl_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/index_select_cpu_dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>

#include "OpenRegNativeFunctions.h"
#include "operators/cpu/OpenRegBoxedCpuKernel.h"
#include "operators/cpu/OpenRegCpuKernelCall.h"
#include "device/OpenRegStream.h"
#include "kernels/CpuIterator.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::native {

// CPU's kernels of index_stub and index_put_stub, launched on the stream; the
// sizes and strides (borrowed ArrayRefs) are copied for the queued kernel.
void index_kernel(at::TensorIteratorBase& iter, at::IntArrayRef index_size, at::IntArrayRef index_stride) {
  static SeenDtypes seen;
  launch_iterator_kernel(
      iter, seen, "at::native::index_stub",
      [size = index_size.vec(), stride = index_stride.vec()](at::TensorIteratorBase& it) {
        use_kernel_addresses(it);
        at::native::index_stub(c10::DeviceType::CPU, it, size, stride);
      });
}

void index_put_kernel(
    at::TensorIterator& iter,
    at::IntArrayRef index_size,
    at::IntArrayRef index_stride,
    bool accumulate) {
  static SeenDtypes seen;
  launch_iterator_kernel(
      iter, seen, "at::native::index_put_stub",
      [size = index_size.vec(), stride = index_stride.vec(), accumulate](at::TensorIterator& it) {
        use_kernel_addresses(it);
        at::native::index_put_stub(c10::DeviceType::CPU, it, size, stride, accumulate);
      });
}

at::Tensor& index_put_impl_(
    at::Tensor& self,
    const c10::List<std::optional<at::Tensor>>& indices,
    const at::Tensor& values,
    bool accumulate,
    bool unsafe) {
  if (!accumulate && !at::globalContext().deterministicAlgorithms()) {
    return at::native::_index_put_impl_(self, indices, values, accumulate, unsafe);
  }
  // For these, torch's implementation sorts the indices on devices other than
  // CPU, through a stub CPU has no kernel for (index_put_with_sort_stub);
  // CPU's own kernel accumulates serially. It runs on CPU aliases.
  CpuKernelCall call("aten::_index_put_impl_", /*accepts_cpu_tensors=*/true);
  call.note(self, "self", /*written=*/true);
  call.note(indices, "indices");
  call.note(values, "values");
  // Queued, when large or behind queued work, like the cpu_kernels route's
  // calls, unless it takes CPU indices (which torch moves to the device for
  // CUDA): those run at once.
  if (!call.takes_cpu_tensors() && call.may_queue()) {
    using IndexPut = at::_ops::_index_put_impl_;
    static const c10::OperatorHandle op = cpu_kernel_operator(IndexPut::name, IndexPut::overload_name);
    return launch_cpu_kernel<IndexPut::schema>(op, self, indices, values, accumulate, unsafe);
  }
  call.begin();
  at::Tensor self_alias = call.written(self);
  at::cpu::_index_put_impl_(self_alias, call.alias(indices), call.alias(values), accumulate, unsafe);
  call.finish();
  return self;
}

namespace {

// index_select's blocks: for each index of the dimensions before `dim`, the
// selected slices of a row-major `self` are contiguous blocks, copied in
// index order into a row-major `out`. Whether the operands qualify: small
// (CPU parallelizes large ones), dense, on one device, int32/int64 indices.
bool copies_blocks(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& out) {
  const at::ScalarType index_type = index.scalar_type();
  return self.dim() > 0 && self.numel() > 0 && self.is_contiguous() && index.dim() <= 1 && index.is_contiguous() &&
      (index_type == at::kLong || index_type == at::kInt) && index.device() == self.device() &&
      out.device() == self.device() && out.scalar_type() == self.scalar_type() && out.is_contiguous() &&
      out.numel() < at::internal::GRAIN_SIZE;
}

void copy_blocks(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& out) {
  const int64_t count = index.numel();
  const int64_t size = self.size(dim);
  const int64_t outer = c10::multiply_integers(self.sizes().slice(0, dim));
  const size_t block = c10::multiply_integers(self.sizes().slice(dim + 1)) * self.element_size();
  const char* src = static_cast<const char*>(orKernelAddress(self.const_data_ptr()));
  char* dst = static_cast<char*>(orKernelAddress(out.mutable_data_ptr()));
  AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "openreg_index_select", [&] {
    const index_t* selected = static_cast<const index_t*>(orKernelAddress(index.const_data_ptr()));
    for (int64_t i = 0; i < count; ++i) {
      TORCH_CHECK_INDEX(selected[i] >= 0 && selected[i] < size, "index out of range in self");
    }
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < count; ++i) {
        std::memcpy(dst, src + (o * size + selected[i]) * block, block);
        dst += block;
      }
    }
  });
}

// index_select into an `out` of the result's shape, launched: by blocks
// (copies_blocks), or by CPU's kernel.
at::Tensor& launch_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());
  const bool blocks = copies_blocks(self, d, index, out);
  static SeenDtypes seen;
  launch_out_kernel<kDeviceTensors>("aten::index_select.out", seen, {{&self, "self"}, {&index, "index"}}, out, [=](auto& t) {
    if (blocks) {
      copy_blocks(t[1], d, t[2], t[0]);
    } else {
      auto c = cpu_tensors_of(t);
      at::cpu::index_select_out(c[0], c[1], dim, c[2]);
    }
  });
  return out;
}

// The result's sizes: self's, with index.numel() at `dim` (self.dim() > 0).
std::vector<int64_t> index_select_sizes(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  std::vector<int64_t> sizes = self.sizes().vec();
  sizes[at::maybe_wrap_dim(dim, self.dim())] = index.numel();
  return sizes;
}

// CPU's kernel in the calling thread, for a 0-dim self (whose result CPU
// shapes) or the error it raises.
at::Tensor& index_select_at_once(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  run_cpu_out_kernel(
      "aten::index_select.out", {{&self, "self"}, {&index, "index"}}, out, [&](at::Tensor& out_alias, CpuKernelCall& call) {
        at::cpu::index_select_out(out_alias, call.alias(self), dim, call.alias(index));
      });
  return out;
}

} // namespace

at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  if (self.dim() == 0 || index.dim() > 1) {
    at::Tensor out = at::empty({0}, self.options());
    return index_select_at_once(self, dim, index, out); // CPU's kernel: a scalar, or its error
  }
  // On self's device (the wrapper's guard), with openreg's own empty kernel
  // rather than through the dispatcher.
  at::Tensor out = empty_memory_format(
      index_select_sizes(self, dim, index), self.scalar_type(), std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  return launch_index_select(self, dim, index, out);
}

at::Tensor& index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  const bool launchable = self.dim() > 0 && index.dim() <= 1 &&
      (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt) && out.scalar_type() == self.scalar_type() &&
      index.device() == self.device() && out.device() == self.device() && !out.storage().is_alias_of(self.storage()) &&
      !out.storage().is_alias_of(index.storage()) && at::has_internal_overlap(out) != at::MemOverlap::Yes;
  if (!launchable) {
    return index_select_at_once(self, dim, index, out); // CPU's kernel: its error, or a scalar
  }
  // CPU's checks passed: resize `out` as CPU's kernel would (warning if it
  // had elements), then launch.
  at::native::resize_output(out, index_select_sizes(self, dim, index));
  return launch_index_select(self, dim, index, out);
}

// flatten_indices_stub: the row-major linear index of each column of a sparse
// COO tensor's indices over the sparse sizes, which torch's device-generic
// checks (sparse_coo_tensor(..., is_coalesced=True) with invariant checks) ask
// of an openreg indices tensor. Computed with openreg operators, as CUDA's
// kernel computes it on its device. The stub is declared in a torch source,
// not a header, so the codegen's stub routes cannot name it.
namespace {

at::Tensor flatten_indices_kernel(const at::Tensor& indices, at::IntArrayRef size) {
  const at::Tensor weights =
      at::tensor(c10::contiguous_strides(size), indices.options().dtype(at::kLong)).unsqueeze(1);
  return indices.mul(weights).sum(0);
}

} // namespace
} // namespace openreg::native

namespace at::native {
using flatten_indices_fn = at::Tensor (*)(const at::Tensor& indices, at::IntArrayRef size);
DECLARE_DISPATCH(flatten_indices_fn, flatten_indices_stub)
REGISTER_PRIVATEUSE1_DISPATCH(flatten_indices_stub, &::openreg::native::flatten_indices_kernel)
} // namespace at::native
