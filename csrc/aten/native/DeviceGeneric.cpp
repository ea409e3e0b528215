// Operators whose torch implementation is device-generic: it builds a
// TensorIterator (or calls other operators) and calls a DispatchStub, the way
// the CUDA build uses the same function. The openreg kernel is torch's own,
// and the stubs it reaches have the CPU kernels as openreg kernels
// (`cpu_kernel: true` in backend_functions.yaml). This is cheaper than running
// the whole CPU operator on CPU aliases (`cpu_kernels:`): no alias tensors,
// and the output is allocated on the device by the iterator.
//
// - abs.out: a unary iterator (real output for complex input), abs_stub.
//   abs and abs_ reach it through their CompositeExplicitAutograd kernels.
// - relu, relu_: clamp_min with 0, a structured operator here.
// - where.self(_out): casts to the result type, accepts 0-dim CPU operands
//   as CUDA does, where_kernel.
// - logical_{and,or,xor,not}.out: comparison iterators, logical_*_stub. The
//   functional and in-place forms are CompositeExplicitAutograd.
// - arange.start_out, linspace.out: resize the output and fill it through a
//   nullary iterator and arange_stub / linspace_stub (a contiguous temporary
//   when the output is not contiguous).
// - prod: a reduction iterator over every dimension, prod_stub (the
//   structured prod.int_out does the same over some).
// - masked_fill_: torch names it masked_fill__cpu, but only its stub
//   (masked_fill_stub) is CPU code. masked_fill is CompositeExplicitAutograd.
//
// - hardtanh (3 forms): clamp, a structured operator here;
//   hardtanh_backward(.grad_input): a binary iterator, hardtanh_backward_stub.
// - uniform_, random_ (3 forms): a nullary iterator and uniform_stub /
//   random_stub / random_from_to_stub / random_full_64_bits_range_stub,
//   whose openreg kernels are in Random.cpp; uniform_ over [0, 1) and
//   random_() of a contiguous tensor skip the iterator and fill it in memory
//   order on kernel addresses (uniform_fill, random_fill, Random.cpp), the
//   order CPU's serial kernels draw in;
//   normal_, bernoulli_.float: normal_stub / bernoulli_scalar_stub take the
//   tensor itself, so the openreg kernels run torch's implementation on a CPU
//   alias of it, which reaches the CPU stubs directly; normal_ on 16 or more
//   contiguous floating-point elements, and bernoulli_ of a contiguous tensor
//   where CPU's kernel is the template, fill them on kernel addresses instead
//   (normal_fill, bernoulli_fill, Random.cpp); randperm.generator_out
//   shuffles an int64 or int32 `out` as CPU's kernel does (randperm_fill) and
//   runs CPU's randperm_out_cpu on a CPU alias of other ones. These kernels
//   run the CPU kernels with the CPU generator of the openreg generator (or
//   of the device's default one), as CpuKernelCall does for `cpu_kernels`, so the
//   stream of numbers is CPU's for the same seed.
//
// where_kernel and masked_fill_stub take a bool condition or mask next to
// operands of another dtype, and their iterators do not promote inputs. On a
// non-CPU device TensorIterator then reports the first input's dtype (bool) as
// the common dtype, which is not one to cast to, so their openreg kernels only
// point the iterator at kernel addresses (use_kernel_addresses) and skip the
// promotion that `cpu_kernel: true` stubs get (CpuIterator.h).
#include <ATen/ops/abs_native.h>
#include <ATen/ops/arange_native.h>
#include <ATen/ops/bernoulli_native.h>
#include <ATen/ops/hardtanh_backward_native.h>
#include <ATen/ops/hardtanh_native.h>
#include <ATen/ops/linspace_native.h>
#include <ATen/ops/logical_and_native.h>
#include <ATen/ops/logical_not_native.h>
#include <ATen/ops/logical_or_native.h>
#include <ATen/ops/logical_xor_native.h>
#include <ATen/ops/masked_fill_native.h>
#include <ATen/ops/normal_native.h>
#include <ATen/ops/prod_native.h>
#include <ATen/ops/random_native.h>
#include <ATen/ops/randperm_native.h>
#include <ATen/ops/relu_native.h>
#include <ATen/ops/uniform_native.h>
#include <ATen/ops/where_native.h>

#include <ATen/native/Activation.h>
#include <ATen/native/IndexKernel.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/native/TensorCompare.h>

#include "OpenRegNativeFunctions.h"
#include "aten/OpenRegGenerator.h"
#include "aten/OpenRegCpuAlias.h"
#include "aten/OpenRegStream.h"
#include "aten/native/CpuIterator.h"
#include "aten/native/Random.h"

namespace openreg::native {

at::Tensor& abs_out(const at::Tensor& self, at::Tensor& out) {
  return at::native::abs_out(self, out);
}

at::Tensor relu(const at::Tensor& self) {
  return at::native::relu(self);
}

at::Tensor& relu_(at::Tensor& self) {
  return at::native::relu_(self);
}

at::Tensor where_self(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  return at::native::where(condition, self, other);
}

at::Tensor& where_self_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  return at::native::where_self_out(condition, self, other, out);
}

at::Tensor& logical_and_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  return at::native::logical_and_out(self, other, out);
}

at::Tensor& logical_or_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  return at::native::logical_or_out(self, other, out);
}

at::Tensor& logical_xor_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  return at::native::logical_xor_out(self, other, out);
}

at::Tensor& logical_not_out(const at::Tensor& self, at::Tensor& out) {
  return at::native::logical_not_out(self, out);
}

at::Tensor& arange_start_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  return at::native::arange_out(start, end, step, out);
}

at::Tensor& linspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps, at::Tensor& out) {
  return at::native::linspace_out(start, end, steps, out);
}

at::Tensor prod(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  return at::native::prod(self, dtype);
}

at::Tensor& masked_fill_scalar(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  return at::native::masked_fill__cpu(self, mask, value);
}

at::Tensor& masked_fill_tensor(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  return at::native::masked_fill__cpu(self, mask, value);
}

void where_kernel(at::TensorIterator& iter) {
  static SeenDtypes seen;
  launch_iterator_kernel(iter, seen, "at::native::where_kernel", [](at::TensorIterator& it) {
    use_kernel_addresses(it);
    at::native::where_kernel(c10::DeviceType::CPU, it);
  });
}

void masked_fill_kernel(at::TensorIterator& iter, const at::Scalar& value) {
  static SeenDtypes seen;
  launch_iterator_kernel(iter, seen, "at::native::masked_fill_stub", [value](at::TensorIterator& it) {
    use_kernel_addresses(it);
    at::native::masked_fill_stub(c10::DeviceType::CPU, it, value);
  });
}

// glu's meta() (at::meta::structured_glu) builds its iterator over the two
// halves of `self`, narrow()s it drops on return: the iterator's pointers are
// good, its tensors are gone. A queued kernel copies an iterator's tensors
// (KernelIterator), so glu's kernel runs in stream order in the calling thread
// instead, where CPU's kernel reads only the pointers.
void glu_kernel(at::TensorIteratorBase& iter) {
  run_kernel_inline(iter.device().index(), [&] { run_cpu_stub(at::native::glu_stub, iter); });
}

namespace {
// A CPU tensor reaches an openreg kernel of a random operator only through the
// dispatch key of an openreg generator; say so, as CpuKernelCall does.
void check_on_openreg(const at::Tensor& self, const char* op) {
  TORCH_CHECK(
      self.device().is_privateuseone(), op,
      " got an openreg generator but runs on the CPU: pass a CPU generator, or put the tensors on openreg.");
}
} // namespace

at::Tensor hardtanh(const at::Tensor& self, const at::Scalar& min_val, const at::Scalar& max_val) {
  return at::native::hardtanh(self, min_val, max_val);
}

at::Tensor& hardtanh_(at::Tensor& self, const at::Scalar& min_val, const at::Scalar& max_val) {
  return at::native::hardtanh_(self, min_val, max_val);
}

at::Tensor& hardtanh_out(const at::Tensor& self, const at::Scalar& min_val, const at::Scalar& max_val, at::Tensor& out) {
  return at::native::hardtanh_out(self, min_val, max_val, out);
}

at::Tensor hardtanh_backward(
    const at::Tensor& grad_output,
    const at::Tensor& self,
    const at::Scalar& min_val,
    const at::Scalar& max_val) {
  return at::native::hardtanh_backward(grad_output, self, min_val, max_val);
}

at::Tensor& hardtanh_backward_out(
    const at::Tensor& grad_output,
    const at::Tensor& self,
    const at::Scalar& min_val,
    const at::Scalar& max_val,
    at::Tensor& grad_input) {
  return at::native::hardtanh_backward_out(grad_output, self, min_val, max_val, grad_input);
}

namespace {
// The CPU generator to draw from for `self`, after the current stream's work.
const at::Generator& prepare_draws(const at::Tensor& self, const std::optional<at::Generator>& generator, const char* op) {
  check_on_openreg(self, op);
  const at::Generator& cpu = cpu_generator_for(generator, self.device().index(), op);
  join_current_stream(self.device().index());
  return cpu;
}

// normal_ and bernoulli_.float: their stubs take the tensor itself rather
// than an iterator, so torch's implementation runs on a CPU alias of `self`
// (CPU's checks, then the CPU stub), with the openreg generator's CPU state.
template <typename Impl>
at::Tensor& on_cpu_alias(at::Tensor& self, const std::optional<at::Generator>& generator, const char* op, Impl&& impl) {
  const at::Generator& cpu = prepare_draws(self, generator, op);
  ScopedCpuAlias alias(self);
  impl(alias.get(), cpu);
  return self;
}
} // namespace

at::Tensor& normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> generator) {
  // A negative or NaN std takes torch's implementation, which raises.
  if (std >= 0 && normal_fill_applies(self)) {
    normal_fill(self, mean, std, prepare_draws(self, generator, "aten::normal_").get<at::CPUGeneratorImpl>());
    return self;
  }
  return on_cpu_alias(self, generator, "aten::normal_", [&](at::Tensor& alias, const at::Generator& cpu) {
    at::native::normal_(alias, mean, std, cpu);
  });
}

// randperm.generator_out, drawing from the openreg generator's CPU state.
// `out` gets its size on the device first; an int64 or int32 `out` is then
// shuffled in place as CPU's kernel does (randperm_fill), which spares two
// resize_ calls and a CPU alias. Other dtypes, and a negative n, which
// reaches CPU's check, take CPU's randperm_out_cpu (its checks, then the
// shuffle) on a CPU alias of `out`, which it never needs to resize.
at::Tensor& randperm_out(int64_t n, std::optional<at::Generator> generator, at::Tensor& out) {
  const at::Generator& cpu = prepare_draws(out, generator, "aten::randperm");
  if (n >= 0 && (out.dim() != 1 || out.size(0) != n)) {
    out.resize_({n});
  }
  if (randperm_fill_applies(out, n)) {
    randperm_fill(out, n, cpu.get<at::CPUGeneratorImpl>());
    return out;
  }
  ScopedCpuAlias alias(out);
  at::native::randperm_out_cpu(n, cpu, alias.get());
  return out;
}

at::Tensor& bernoulli_float(at::Tensor& self, double p, std::optional<at::Generator> generator) {
  // A p outside [0, 1] (or NaN) takes torch's implementation, which raises.
  if (0 <= p && p <= 1 && bernoulli_fill_applies(self)) {
    bernoulli_fill(self, p, prepare_draws(self, generator, "aten::bernoulli_").get<at::CPUGeneratorImpl>());
    return self;
  }
  return on_cpu_alias(self, generator, "aten::bernoulli_", [&](at::Tensor& alias, const at::Generator& cpu) {
    at::native::bernoulli_(alias, p, cpu);
  });
}

at::Tensor& uniform_(at::Tensor& self, double from, double to, std::optional<at::Generator> generator) {
  if (from == 0.0 && to == 1.0 && uniform_fill_applies(self)) {
    uniform_fill(self, prepare_draws(self, generator, "aten::uniform_").get<at::CPUGeneratorImpl>());
    return self;
  }
  check_on_openreg(self, "aten::uniform_");
  return at::native::uniform_(self, from, to, std::move(generator));
}

at::Tensor& random_(at::Tensor& self, std::optional<at::Generator> generator) {
  if (random_fill_applies(self)) {
    random_fill(self, prepare_draws(self, generator, "aten::random_").get<at::CPUGeneratorImpl>());
    return self;
  }
  check_on_openreg(self, "aten::random_");
  return at::native::random_(self, std::move(generator));
}

at::Tensor& random_from(
    at::Tensor& self,
    int64_t from,
    std::optional<int64_t> to,
    std::optional<at::Generator> generator) {
  check_on_openreg(self, "aten::random_");
  return at::native::random_(self, from, to, std::move(generator));
}

at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> generator) {
  check_on_openreg(self, "aten::random_");
  return at::native::random_(self, to, std::move(generator));
}

} // namespace openreg::native
