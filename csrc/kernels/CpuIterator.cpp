#include "kernels/CpuIterator.h"

#include <ATen/Dispatch_v2.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Load.h>

#include <memory>
#include <string>
#include <vector>

#include "operators/cpu/OpenRegCpuAlias.h"
#include "device/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg::native {
namespace {

// TensorIteratorBase keeps its operands protected and has no public way to
// exchange one after build(); this accessor reaches them the way a derived
// class may.
struct IteratorAccess : at::TensorIteratorBase {
  static at::OperandInfo& operand(at::TensorIteratorBase& iter, int64_t arg) {
    return (iter.*(&IteratorAccess::operands_))[arg];
  }
  static bool is_reduction(const at::TensorIteratorBase& iter) {
    return iter.*(&IteratorAccess::is_reduction_);
  }
};

// The number of elements from t's first to its last, in memory (1 for a
// tensor with no elements, which needs no memory but gets some).
int64_t reach(const at::TensorBase& t) {
  int64_t extent = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) {
      return 1;
    }
    extent += (t.size(d) - 1) * t.stride(d);
  }
  return extent;
}

// t's memory from its first element to its last, cast to `dtype`, viewed
// with t's sizes and strides.
at::Tensor cast_over_reach(const at::Tensor& t, at::ScalarType dtype) {
  return t.as_strided({reach(t)}, {1}).to(dtype).as_strided(t.sizes(), t.strides());
}

// A dense t (its elements fill one block of memory, in some order) cast to
// `dtype` into CPU memory with t's strides: one conversion loop over the
// block, with c10::convert, the conversion CPU's copy_ kernel applies. CPU's
// own TensorIterator casts such an operand with to(), an allocation through
// the dispatcher and a copy_ iterator, a large part of what `x * bool_mask`
// costs on 16 elements (docs/performance.md). Undefined for other dtypes.
at::Tensor cast_dense(const at::TensorBase& t, at::ScalarType dtype) {
  // From half, CPU's copy_ converts with F16C instructions, which give NaN
  // other bits than c10::convert (the bit test in tests/test_structured.py).
  if (!plain_dtype(t.scalar_type()) || !plain_dtype(dtype) || t.scalar_type() == at::kHalf) {
    return {};
  }
  at::Tensor out = at::detail::empty_strided_cpu(t.sizes(), t.strides(), dtype);
  const int64_t n = t.numel();
  const void* from = orKernelAddress(t.const_data_ptr());
  void* to = out.mutable_data_ptr();
  AT_DISPATCH_V2(
      t.scalar_type(), "openreg_cast_from", AT_WRAP([&] {
        using from_t = scalar_t;
        const auto* src = static_cast<const from_t*>(from);
        AT_DISPATCH_V2(
            dtype, "openreg_cast_to", AT_WRAP([&] {
              auto* dst = static_cast<scalar_t*>(to);
              for (int64_t i = 0; i < n; ++i) {
                // c10::load: any nonzero byte of a bool is true (a uint8 tensor
                // viewed as bool), as CPU's copy_ reads it.
                dst[i] = c10::convert<scalar_t>(c10::load(&src[i]));
              }
            }),
            AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kBool, at::kHalf, at::kBFloat16);
      }),
      AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kBool, at::kHalf, at::kBFloat16);
  return out;
}

// A tensor with t's sizes and strides over fresh memory of `dtype` (holding
// t's values cast when `copy`). Keeping the element strides means the
// iterator's byte strides, already permuted and coalesced, only scale by the
// item size. A dense t keeps them through to() (preserve_format); otherwise
// the fresh memory spans every element t can reach, so broadcast (zero-stride)
// operands stay cheap.
//
// A small input, which the kernel only reads, is cast into CPU memory from a
// recycled alias, sparing a device allocation and a trip through openreg's
// copy_, a large part of a small mixed-dtype call; large ones stay on
// the device, whose caching allocator keeps their blocks. The alias is read
// after the work queued on the stream.
at::Tensor recast_keeping_strides(const at::TensorBase& t, at::ScalarType dtype, bool copy) {
  if (t.numel() == 0) {
    return at::empty_strided(t.sizes(), t.strides(), t.options().dtype(dtype));
  }
  const bool dense = t.is_non_overlapping_and_dense();
  if (!copy) {
    return dense ? at::empty_strided(t.sizes(), t.strides(), t.options().dtype(dtype))
                 : at::empty({reach(t)}, t.options().dtype(dtype)).as_strided(t.sizes(), t.strides());
  }
  const bool small = t.numel() < at::internal::GRAIN_SIZE;
  if (t.device().is_privateuseone() && small) {
    join_current_stream(t.device().index());
  }
  if (small && dense && !t.is_conj() && !t.is_neg()) {
    if (at::Tensor cast = cast_dense(t, dtype); cast.defined()) {
      return cast;
    }
  }
  if (t.device().is_privateuseone() && small) {
    ScopedCpuAlias source(t);
    return dense ? source.get().to(dtype) : cast_over_reach(source.get(), dtype);
  }
  return dense ? at::Tensor(t).to(dtype) : cast_over_reach(at::Tensor(t), dtype);
}

// Points every operand at kernel addresses and, when a reduction iterator is
// large enough for CPU's parallel paths (TensorIteratorReduce.cpp: two-pass
// and per-thread reductions, from GRAIN_SIZE elements), gives its operands on
// openreg to `exchange(op, arg)`, which gives the CPU kernel CPU aliases as
// their tensors: those paths build new iterators from the tensors (and
// allocate per-thread buffers like the output) and would read device
// addresses. Below that, the reduction kernels bound here (sum, prod, and,
// or, argmax, argmin, max_values, min_values) read and write through the
// iterator's data pointers only; the one tensor method they call,
// `iter.output_base().fill_(identity)`, runs openreg's fill_ on the output,
// which costs less than a CPU alias and CPU's fill_ (docs/performance.md).
// Translating twice (a structured wrapper's prepare_structured_impl, then the
// stub kernel impl() reached) changes nothing.
template <class Exchange>
void translate(at::TensorIteratorBase& iter, Exchange&& exchange) {
  const bool large = IteratorAccess::is_reduction(iter) && iter.numel() >= at::internal::GRAIN_SIZE;
  for (int64_t arg = 0; arg < iter.ntensors(); ++arg) {
    at::OperandInfo& op = IteratorAccess::operand(iter, arg);
    // orKernelAddress gives host addresses back unchanged.
    void* kernel_address = orKernelAddress(op.data);
    op.data = kernel_address;
    if (large && op.tensor_base().defined() &&
        op.tensor_base().device().is_privateuseone() && op.tensor_base().scalar_type() == op.current_dtype) {
      exchange(op, arg);
    }
  }
}

} // namespace

KernelIterator::KernelIterator(const at::TensorIteratorBase& iter) : iter_(iter) {
  operands_.resize(static_cast<size_t>(iter_.ntensors()));
  for (int64_t arg = 0; arg < iter_.ntensors(); ++arg) {
    at::OperandInfo& op = IteratorAccess::operand(iter_, arg);
    Operand& kept = operands_[static_cast<size_t>(arg)];
    const at::TensorBase& t = op.original_tensor_base().defined() ? op.original_tensor_base() : op.tensor_base();
    if (t.defined() && !t.device().is_privateuseone()) {
      // A CPU scalar (TensorIterator admits no other CPU operand on openreg)
      // is copied: the kernel reads the copy.
      TORCH_INTERNAL_ASSERT(
          t.dim() == 0 && !op.original_tensor_base().defined(), "a CPU operand of an openreg iterator that is not a scalar");
      kept.cpu_scalar = kernel_argument(t);
      op.data = kept.cpu_scalar.data_ptr();
    } else if (t.defined()) {
      kept.tensor = kernel_tensor_meta(t);
      if (op.original_tensor_base().defined()) {
        kept.alias = kernel_tensor_meta(op.tensor_base());
        kept.exchanged = true;
      }
    }
    if (op.original_tensor_base().defined()) {
      op.restore_original_tensor();
    }
    op.tensor(c10::MaybeOwned<at::TensorBase>::owned(at::TensorBase()));
  }
}

namespace {
// The iterators Views hand out in this thread, by nesting level.
struct ViewIterators {
  std::vector<std::unique_ptr<at::TensorIterator>> levels;
  size_t used = 0;
};
thread_local ViewIterators view_iterators;
} // namespace

KernelIterator::Views::Views(const KernelIterator& copy)
    : iter([]() -> at::TensorIterator& {
        ViewIterators& v = view_iterators;
        if (v.used == v.levels.size()) {
          v.levels.push_back(std::make_unique<at::TensorIterator>());
        }
        return *v.levels[v.used++];
      }()) {
  iter = copy.iter_;
  for (int64_t arg = 0; arg < iter.ntensors(); ++arg) {
    at::OperandInfo& op = IteratorAccess::operand(iter, arg);
    const Operand& kept = copy.operands_[static_cast<size_t>(arg)];
    if (kept.cpu_scalar.defined()) {
      op.tensor(c10::MaybeOwned<at::TensorBase>::borrowed(kept.cpu_scalar));
    } else if (kept.tensor.defined) {
      op.tensor(c10::MaybeOwned<at::TensorBase>::owned(kernel_view(kept.tensor)));
      if (kept.exchanged) {
        op.exchange_tensor(c10::MaybeOwned<at::TensorBase>::owned(kernel_view(kept.alias)));
      }
    }
  }
}

KernelIterator::Views::~Views() {
  for (int64_t arg = 0; arg < iter.ntensors(); ++arg) {
    at::OperandInfo& op = IteratorAccess::operand(iter, arg);
    if (op.original_tensor_base().defined()) {
      op.restore_original_tensor();
    }
    op.tensor(c10::MaybeOwned<at::TensorBase>::owned(at::TensorBase()));
  }
  --view_iterators.used;
}

uint64_t dtype_key(const at::TensorIteratorBase& iter) {
  uint64_t key = static_cast<uint64_t>(iter.ntensors());
  for (int64_t arg = 0; arg < iter.ntensors() && arg < 7; ++arg) {
    key |= static_cast<uint64_t>(static_cast<uint8_t>(iter.dtype(arg))) << (8 * (arg + 1));
  }
  return key;
}

uint64_t strings_key(std::initializer_list<c10::string_view> strings) {
  uint64_t h = 1469598103934665603ull;
  for (c10::string_view s : strings) {
    for (char c : s) {
      h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    }
    h = (h ^ 0xff) * 1099511628211ull;
  }
  return h & ~uint64_t{0xff}; // dtype_key's operand count stays readable
}

bool scalar_fits(const c10::Scalar& value, at::ScalarType dtype) {
  try {
    AT_DISPATCH_V2(
        dtype, "scalar_fits", AT_WRAP([&] { (void)value.to<scalar_t>(); }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX),
        at::kHalf, at::kBFloat16, at::kBool);
  } catch (const c10::Error&) {
    return false; // or a dtype CPU's kernels may not take: a new kind either way
  }
  return true;
}

const char* stub_name_from(const char* pretty_function) {
  std::string text(pretty_function);
  const size_t at = text.find("stub = ");
  if (at == std::string::npos) {
    return "a DispatchStub's CPU kernel";
  }
  std::string name = text.substr(at + 7);
  name = name.substr(0, name.find_first_of(";]"));
  const size_t start = name.find_first_not_of("(& ");
  name = name.substr(start == std::string::npos ? 0 : start);
  while (!name.empty() && (name.back() == ')' || name.back() == ' ')) {
    name.pop_back();
  }
  return (new std::string(name))->c_str(); // one per stub, for the process
}

void use_kernel_addresses(at::TensorIteratorBase& iter) {
  translate(iter, [](at::OperandInfo& op, int64_t /*arg*/) {
    op.exchange_tensor(c10::MaybeOwned<at::TensorBase>::owned(cpu_alias(at::Tensor(op.tensor_base()))));
  });
}

AsCpuIterator::AsCpuIterator(at::TensorIteratorBase& iter) : iter_(iter) {
  if (!inside_kernel() && iter.ntensors() > 0 && iter.device().is_privateuseone()) {
    // CPU code in the calling thread (a route not launched yet) reads the
    // operands at once: after the stream's work.
    join_current_stream(iter.device().index());
  }
  promote(iter);
  translate(iter, [&](at::OperandInfo& op, int64_t arg) {
    const at::Tensor& alias = aliases_.get(op.tensor_base()).first->alias;
    op.exchange_tensor(c10::MaybeOwned<at::TensorBase>::borrowed(alias));
    exchanged_.push_back(arg);
  });
}

AsCpuIterator::~AsCpuIterator() {
  restore_operands();
}

// The iterator gets its device tensors back (a later stub on the same
// iterator exchanges them again), and the aliases end.
void AsCpuIterator::restore_operands() {
  for (const int64_t arg : exchanged_) {
    IteratorAccess::operand(iter_, arg).restore_original_tensor();
  }
  exchanged_.clear();
  aliases_.end();
}

void AsCpuIterator::promote(at::TensorIteratorBase& iter) {
  const auto common = iter.maybe_common_dtype();
  if (!common.has_value()) {
    return;
  }
  for (int64_t arg = 0; arg < iter.ntensors(); ++arg) {
    at::OperandInfo& op = IteratorAccess::operand(iter, arg);
    const at::ScalarType dtype = op.current_dtype;
    if (dtype == *common || !op.tensor_base().defined()) {
      continue;
    }
    // Reductions never cast to their outputs (TensorIterator::reduce_op
    // promotes inputs only): argmax writes int64 indices into an int64
    // output whatever the input's dtype.
    if (op.is_output && (dtype == at::ScalarType::Bool || IteratorAccess::is_reduction(iter))) {
      continue;
    }
    at::Tensor promoted =
        recast_keeping_strides(op.tensor_base(), *common, /*copy=*/!op.is_output || op.is_read_write);
    const int64_t old_size = c10::elementSize(dtype);
    const int64_t new_size = c10::elementSize(*common);
    for (auto& stride : op.stride_bytes) {
      stride = stride / old_size * new_size;
    }
    op.data = promoted.data_ptr();
    op.current_dtype = op.target_dtype = *common;
    if (op.is_output) {
      outputs_.emplace_back(at::Tensor(op.tensor_base()), std::move(promoted));
    } else {
      if (op.tensor_base().device().is_privateuseone() && at::isReducedFloatingType(*common) && iter.is_scalar(arg)) {
        // CPU kernels read a scalar operand's value from the tensor that
        // exchange_tensor keeps as the original, in its own dtype
        // (TensorIteratorBase::original_scalar_value: add_kernel, mul_kernel,
        // div_true_kernel, ... when the common dtype is BFloat16 or Half and
        // the operand is a scalar, iter.is_scalar), so the original must be
        // CPU-readable: exchange for a CPU alias first,
        // and the second exchange keeps that alias as the original. (The
        // reduction branch of use_kernel_addresses exchanges a second time too;
        // OperandInfo::exchange_tensor checks for a first exchange only in
        // debug builds of torch.)
        op.exchange_tensor(c10::MaybeOwned<at::TensorBase>::owned(cpu_alias(at::Tensor(op.tensor_base()))));
      }
      op.exchange_tensor(c10::MaybeOwned<at::TensorBase>::owned(std::move(promoted)));
    }
  }
}

void AsCpuIterator::write_back() {
  restore_operands();
  for (auto& [output, promoted] : outputs_) {
    output.copy_(promoted);
  }
  outputs_.clear();
}

bool plain_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kBool:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
    case at::kComplexFloat: case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

} // namespace openreg::native
