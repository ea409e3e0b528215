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
// - uniform_, random_ (3 forms), normal_, bernoulli_.float, exponential_,
//   cauchy_, log_normal_, geometric_, randperm.generator_out: torch's implementation (its checks, then the CPU
//   stub) on a CPU tensor of self's geometry, with the CPU generator of the
//   openreg generator (or of the device's default one), as CpuKernelCall
//   does for `cpu_kernels`, so the stream of numbers is CPU's for the same
//   seed. Where CPU's kernel draws in memory order, a plain loop does the
//   same without an iterator or a CPU tensor (Random.cpp: uniform_(0, 1),
//   random_() of a contiguous tensor, normal_ of 16 or more contiguous
//   floating-point elements, bernoulli_(p) where CPU's kernel is the
//   template, randperm into int64 or int32). The draws are made at the call
//   and land in stream order (DrawTarget, below). The stubs' openreg kernels
//   (Random.cpp) serve torch code that calls the stubs on openreg iterators.
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
#include <ATen/ops/cauchy_native.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/exponential_native.h>
#include <ATen/ops/geometric_native.h>
#include <ATen/ops/hardtanh_backward_native.h>
#include <ATen/ops/hardtanh_native.h>
#include <ATen/ops/linspace_native.h>
#include <ATen/ops/logical_and_native.h>
#include <ATen/ops/logical_not_native.h>
#include <ATen/ops/logical_or_native.h>
#include <ATen/ops/log_normal_native.h>
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
#include "device/OpenRegGenerator.h"
#include "graphs/OpenRegGraph.h"
#include "operators/cpu/OpenRegCpuAlias.h"
#include "operators/OpenRegLaunch.h"
#include "device/OpenRegStream.h"
#include "kernels/CpuIterator.h"
#include "kernels/Random.h"

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
  launch_iterator_kernel(
      iter, seen, "at::native::masked_fill_stub",
      [value](at::TensorIterator& it) {
        use_kernel_addresses(it);
        at::native::masked_fill_stub(c10::DeviceType::CPU, it, value);
      },
      scalar_misfits(iter, value));
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
// Where a random operator's draws go. They are drawn at the call, in the
// calling thread, which owns the generator's state: host code after the call
// (get_rng_state, a draw on another stream) sees the generator advanced, as
// CUDA's launch reserves its Philox offset on the host. CPU's generators have
// no offset to reserve, so the numbers themselves are drawn then: into
// `self`'s memory when the current stream has nothing queued (inside a
// kernel, and with OPENREG_LAUNCH_BLOCKING=1, after waiting for it), else into
// host memory of self's geometry, which a kernel queued on the stream copies
// into `self`: the call does not wait for the work queued before it, and the
// values land in stream order. OPENREG_QUEUE_ALL_KERNELS=1 stages every draw,
// and so does a graph's replay (capture_draws).
class DrawTarget {
 public:
  DrawTarget(const at::Tensor& self, const std::optional<at::Generator>& generator, const char* op, bool staged = false)
      : self_(self), op_(op) {
    check_on_openreg(self, op);
    generator_ = &cpu_generator_for(generator, self.device().index(), op);
    const c10::DeviceIndex device = self.device().index();
    if (!staged && (inside_kernel() || launch_blocking() || (!queue_all_kernels() && current_stream_idle(device)))) {
      join_current_stream(device);
    } else {
      staged_ = at::empty_strided(self.sizes(), self.strides(), self.options().device(c10::kCPU));
    }
  }
  DrawTarget(const DrawTarget&) = delete;
  DrawTarget& operator=(const DrawTarget&) = delete;

  const at::Tensor& self() const {
    return self_;
  }
  const at::Generator& generator() const {
    return *generator_;
  }
  at::CPUGeneratorImpl* cpu_generator() const {
    return generator_->get<at::CPUGeneratorImpl>();
  }
  // Where self's first element goes.
  void* data() {
    return staged_.defined() ? staged_.mutable_data_ptr() : orKernelAddress(self_.mutable_data_ptr());
  }
  // A CPU tensor of self's geometry over the memory the draws go to.
  at::Tensor& tensor() {
    if (staged_.defined()) {
      return staged_;
    }
    if (!alias_.has_value()) {
      alias_.emplace(self_);
    }
    return alias_->get();
  }
  // The staged draws, for a graph's replay (capture_draws).
  at::Tensor take_staged() {
    return std::move(staged_);
  }
  // The draws were made: a staged one is queued for `self`.
  void done() {
    if (!staged_.defined()) {
      return;
    }
    launch_kernel(
        self_.device().index(), op_, self_.numel(),
        [target = kernel_cpu_tensor_meta(self_), staged = std::move(staged_)] { kernel_view(target).copy_(staged); });
  }

 private:
  const at::Tensor& self_;
  const char* op_;
  const at::Generator* generator_ = nullptr;
  at::Tensor staged_;
  std::optional<ScopedCpuAlias> alias_;
};

// Draws already made, for the kernel of a graph that copies them into the
// tensor, one replay's per run, in the order the replays made them.
class ReplayDraws {
 public:
  void push(at::Tensor values) {
    const std::lock_guard<std::mutex> lock(mutex_);
    values_.push_back(std::move(values));
  }
  at::Tensor pop() {
    const std::lock_guard<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(!values_.empty(), "a graph's random operator ran without its replay's draws");
    at::Tensor values = std::move(values_.front());
    values_.pop_front();
    return values;
  }

 private:
  std::mutex mutex_;
  std::deque<at::Tensor> values_;
};

// A random operator while the current stream is captured into a graph:
// nothing is drawn now. Each replay draws afresh, on the host before it
// queues the graph's kernels (OpenRegGraph.h), so the generator advances at
// the replay as at an eager call, and the recorded kernel copies that
// replay's values into `self` (CUDA's graphs get fresh numbers per replay too,
// from a Philox offset the replay advances).
template <typename Draw>
void capture_draws(const at::Tensor& self, const std::optional<at::Generator>& generator, const char* op, Draw draw) {
  const c10::DeviceIndex device = self.device().index();
  {
    // The argument errors raise at the call, as eagerly: one draw from a copy
    // of the generator, whose own state stays as it is.
    const at::Generator& original =
        generator.has_value() && generator->defined() ? *generator : default_generator(device);
    const std::optional<at::Generator> copy = original.clone();
    DrawTarget trial(self, copy, op, /*staged=*/true);
    draw(trial);
  }
  auto draws = std::make_shared<ReplayDraws>();
  add_replay_step(device, [draws, self = at::Tensor(self), generator, op, draw]() -> std::function<void()> {
    DrawTarget target(self, generator, op, /*staged=*/true);
    draw(target);
    return [draws, values = target.take_staged()]() mutable { draws->push(std::move(values)); };
  });
  launch_kernel_made(device, op, [&] {
    return [target = kernel_cpu_tensor_meta(self), draws] { kernel_view(target).copy_(draws->pop()); };
  });
}

// draw(target) into `self`, then the staged values queued (DrawTarget).
// draw takes what it needs by value, and `self` from the target: under graph
// capture it runs at each replay (capture_draws).
template <typename Draw>
at::Tensor& draw_into(at::Tensor& self, const std::optional<at::Generator>& generator, const char* op, Draw&& draw) {
  if (C10_UNLIKELY(orStreamCaptureUnderway()) && self.device().is_privateuseone() &&
      current_stream_capturing(self.device().index())) {
    capture_draws(self, generator, op, std::forward<Draw>(draw));
    return self;
  }
  DrawTarget target(self, generator, op);
  draw(target);
  target.done();
  return self;
}
} // namespace

at::Tensor& normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> generator) {
  // A negative or NaN std takes torch's implementation, which raises.
  return draw_into(self, generator, "aten::normal_", [=](DrawTarget& target) {
    if (std >= 0 && normal_fill_applies(target.self())) {
      normal_fill(target.self(), target.data(), mean, std, target.cpu_generator());
    } else {
      at::native::normal_(target.tensor(), mean, std, target.generator());
    }
  });
}

// randperm.generator_out, drawing from the openreg generator's CPU state.
// `out` gets its size on the device first; an int64 or int32 `out` is then
// shuffled as CPU's kernel does (randperm_fill), which spares two resize_
// calls. Other dtypes, and a negative n, which reaches CPU's check, take
// CPU's randperm_out_cpu (its checks, then the shuffle) on the target's CPU
// tensor, which it never needs to resize.
at::Tensor& randperm_out(int64_t n, std::optional<at::Generator> generator, at::Tensor& out) {
  if (n >= 0 && (out.dim() != 1 || out.size(0) != n)) {
    out.resize_({n});
  }
  return draw_into(out, generator, "aten::randperm", [=](DrawTarget& target) {
    if (randperm_fill_applies(target.self(), n)) {
      randperm_fill(target.self(), target.data(), n, target.cpu_generator());
    } else {
      at::native::randperm_out_cpu(n, target.generator(), target.tensor());
    }
  });
}

at::Tensor& bernoulli_float(at::Tensor& self, double p, std::optional<at::Generator> generator) {
  // A p outside [0, 1] (or NaN) takes torch's implementation, which raises.
  return draw_into(self, generator, "aten::bernoulli_", [=](DrawTarget& target) {
    if (0 <= p && p <= 1 && bernoulli_fill_applies(target.self())) {
      bernoulli_fill(target.self(), target.data(), p, target.cpu_generator());
    } else {
      at::native::bernoulli_(target.tensor(), p, target.generator());
    }
  });
}

// uniform_ and the random_ forms: torch's implementation (its checks, a
// nullary iterator and the CPU stub) on the target's CPU tensor, or for
// uniform_(0, 1) and random_() of a contiguous tensor a plain loop in memory
// order, the order CPU's serial kernels draw in.
at::Tensor& uniform_(at::Tensor& self, double from, double to, std::optional<at::Generator> generator) {
  return draw_into(self, generator, "aten::uniform_", [=](DrawTarget& target) {
    if (from == 0.0 && to == 1.0 && uniform_fill_applies(target.self())) {
      uniform_fill(target.self(), target.data(), target.cpu_generator());
    } else {
      at::native::uniform_(target.tensor(), from, to, target.generator());
    }
  });
}

at::Tensor& random_(at::Tensor& self, std::optional<at::Generator> generator) {
  return draw_into(self, generator, "aten::random_", [=](DrawTarget& target) {
    if (random_fill_applies(target.self())) {
      random_fill(target.self(), target.data(), target.cpu_generator());
    } else {
      at::native::random_(target.tensor(), target.generator());
    }
  });
}

at::Tensor& random_from(
    at::Tensor& self,
    int64_t from,
    std::optional<int64_t> to,
    std::optional<at::Generator> generator) {
  return draw_into(self, generator, "aten::random_", [=](DrawTarget& target) {
    at::native::random_(target.tensor(), from, to, target.generator());
  });
}

at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> generator) {
  return draw_into(self, generator, "aten::random_", [=](DrawTarget& target) {
    at::native::random_(target.tensor(), to, target.generator());
  });
}

// The other distributions with scalar parameters: torch's implementation on
// the target's CPU tensor.
at::Tensor& exponential_(at::Tensor& self, double lambd, std::optional<at::Generator> generator) {
  return draw_into(self, generator, "aten::exponential_", [=](DrawTarget& target) {
    at::native::exponential_(target.tensor(), lambd, target.generator());
  });
}

at::Tensor& cauchy_(at::Tensor& self, double median, double sigma, std::optional<at::Generator> generator) {
  return draw_into(self, generator, "aten::cauchy_", [=](DrawTarget& target) {
    at::native::cauchy_(target.tensor(), median, sigma, target.generator());
  });
}

at::Tensor& log_normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> generator) {
  return draw_into(self, generator, "aten::log_normal_", [=](DrawTarget& target) {
    at::native::log_normal_(target.tensor(), mean, std, target.generator());
  });
}

at::Tensor& geometric_(at::Tensor& self, double p, std::optional<at::Generator> generator) {
  return draw_into(self, generator, "aten::geometric_", [=](DrawTarget& target) {
    at::native::geometric_(target.tensor(), p, target.generator());
  });
}

} // namespace openreg::native
