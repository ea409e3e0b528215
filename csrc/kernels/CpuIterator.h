// TensorIterators on device memory: the CPU kernel of a stub run on an
// openreg iterator (run_cpu_stub, CpuKernelOf), an iterator pointed at kernel
// addresses (use_kernel_addresses, prepare_structured_impl).
//
// The simulated openreg device executes torch's own CPU kernels on device
// memory: a DispatchStub kernel for openreg calls the stub's CPU entry with the
// same TensorIterator. This is what makes native ops run at CPU speed.
//
// Two things differ from a CPU iterator, and AsCpuIterator fixes both:
// - TensorIteratorBase::compute_types only promotes operands to the common
//   dtype when the common device is CPU (CUDA's kernels cast while loading).
//   CPU kernels assume the operands already have the common dtype, so inputs
//   are cast first and outputs cast back afterwards.
// - The operands' data pointers are device addresses, which CPU code cannot
//   dereference; they are replaced by the addresses kernels use
//   (orKernelAddress).
// CpuKernelOf launches the kernel on the current stream.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include <ATen/TensorIterator.h>
#include <ATen/native/DispatchStub.h>
#include <c10/util/SmallVector.h>

#include "operators/cpu/OpenRegCpuAlias.h"
#include "operators/OpenRegLaunch.h"

namespace openreg::native {

// Inputs whose dtype is not the iterator's common dtype are replaced by copies
// in the common dtype; outputs of another dtype (except bool outputs, which
// the CPU comparison kernels write themselves) compute into a temporary that
// write_back() copies into the caller's tensor. Iterators without a common
// dtype keep their dtypes. Every operand then points at kernel addresses.
//
// On a reduction of GRAIN_SIZE elements or more, CPU's kernel builds
// iterators of its own over the operands (the two-pass and per-thread paths
// of TensorIteratorReduce.cpp), so those operands are exchanged for CPU
// aliases (CpuAliases) for the length of the kernel; write_back() or, if the
// kernel threw, the destructor gives the iterator its tensors back and ends
// the aliases. Smaller reductions keep their openreg tensors
// (CpuIterator.cpp, translate).
class AsCpuIterator {
 public:
  explicit AsCpuIterator(at::TensorIteratorBase& iter);
  AsCpuIterator(const AsCpuIterator&) = delete;
  AsCpuIterator& operator=(const AsCpuIterator&) = delete;
  ~AsCpuIterator();
  void write_back();

 private:
  void promote(at::TensorIteratorBase& iter);
  void restore_operands();

  at::TensorIteratorBase& iter_;
  // The iterator's operands exchanged for aliases (borrowed from aliases_).
  c10::SmallVector<int64_t, 2> exchanged_;
  CpuAliases<2> aliases_;

  // (caller's output, temporary in the common dtype). The output operand is
  // not exchanged: TensorIteratorBase::cast_outputs, which CPU's Loops.h calls,
  // would then copy through OperandInfo::original_tensor(), which
  // exchange_tensor does not set on this torch version.
  std::vector<std::pair<at::Tensor, at::Tensor>> outputs_;
};

// Points every operand of `iter` at kernel addresses (orKernelAddress). The
// kernel that reads them runs in stream order: launched (CpuKernelOf), or
// after join_current_stream (which AsCpuIterator does outside a kernel).
void use_kernel_addresses(at::TensorIteratorBase& iter);

// The dtypes of AT_ALL_TYPES_AND_COMPLEX, bool, half and bfloat16: those the
// direct loops here (casts, fills) dispatch over.
bool plain_dtype(at::ScalarType dtype);

// Called by the generated structured wrappers between meta() and impl()
// (codegen STRUCTURED_PREPARE). Some CPU impls call their CPU kernel directly
// rather than through the stub (gelu_out_cpu: GeluKernel(kCPU, ...)), so an
// iterator must hold kernel addresses before impl() runs; the stubs impl()
// reaches translate again, which changes nothing.
template <typename Op>
void prepare_structured_impl(Op& op) {
  if constexpr (std::is_base_of_v<at::TensorIteratorBase, Op>) {
    use_kernel_addresses(op);
  }
}

// Iter is TensorIteratorBase or TensorIterator, whichever the stub takes.
template <typename Stub, typename Iter, typename... Args>
void run_cpu_stub(Stub& stub, Iter& iter, Args&&... args) {
  AsCpuIterator cpu_iter(iter);
  stub(c10::DeviceType::CPU, iter, std::forward<Args>(args)...);
  cpu_iter.write_back();
}

// A copy of `iter` that a queued kernel can keep. The structured classes'
// iterators borrow their operands from the caller's frame, so the copy keeps
// none of the caller's tensors: the launching thread captures what a
// kernel_view of each needs (KernelTensorMeta); a CPU scalar operand is
// copied (kernel_argument). run(f), in the thread that runs the kernel, calls
// f on that thread's own iterator, assigned from the copy, with views as its
// operands, and drops the views afterwards. The kernel's thread makes and
// frees the views, and it only reads the copy: the launching thread, which
// frees the copy (OpenRegLaunch.h), then finds its memory in its own cache
// (a kernel writing into the copy cost each launch a few tenths of a
// microsecond in cache misses).
class KernelIterator {
 public:
  explicit KernelIterator(const at::TensorIteratorBase& iter);

  template <typename F>
  void run(F&& f) const {
    Views views(*this);
    f(views.iter);
  }

 private:
  // The calling thread's iterator for a kernel of `copy` (one per nesting
  // level), its operands views of copy's, until destroyed.
  struct Views {
    explicit Views(const KernelIterator& copy);
    Views(const Views&) = delete;
    Views& operator=(const Views&) = delete;
    ~Views();
    at::TensorIterator& iter;
  };

  struct Operand {
    KernelTensorMeta tensor;
    // An operand exchanged for a CPU alias of its memory keeps the original:
    // views of both (the alias's when `exchanged`).
    KernelTensorMeta alias;
    bool exchanged = false;
    at::Tensor cpu_scalar; // a CPU scalar operand's copy
  };
  at::TensorIterator iter_;
  c10::SmallVector<Operand, 4> operands_;
};

// "at::native::exp_stub", from the compiler's name of this instantiation
// (GCC and Clang spell it "[with auto* stub = (& at::native::exp_stub)]" or
// "[stub = &at::native::exp_stub]"): the name a kernel's error gives.
const char* stub_name_from(const char* pretty_function);
template <auto* stub>
const char* stub_name() {
  static const char* const name = stub_name_from(__PRETTY_FUNCTION__);
  return name;
}

// The openreg kernel of every stub of the `stub_cpu_kernel` route
// (backend_functions.yaml's `stubs: cpu_kernels: true`):
// CpuKernelOf<&at::native::exp_stub>::run has exactly the stub's function
// type. It launches CPU's kernel of the stub on the current stream, over
// KernelIterator(iter), with kernel_argument(arg) of the other arguments.
template <auto* stub, typename FnPtr = typename std::remove_pointer_t<decltype(stub)>::FnPtr>
struct CpuKernelOf;

// The operand dtypes of `iter`, packed (what a CPU kernel dispatches on).
uint64_t dtype_key(const at::TensorIteratorBase& iter);

// Whether CPU's kernel converts `value` to `dtype` without its "value cannot
// be converted to type ... without overflow" error (masked_fill's value).
bool scalar_fits(const c10::Scalar& value, at::ScalarType dtype);

// Bits of a stub's key for its Scalar arguments that do not fit the output's
// dtype: a kernel converts them as it runs, so a call whose value does not fit
// is a new kind, first run in the calling thread, where CPU's error raises.
template <typename... Args>
uint64_t scalar_misfits(const at::TensorIteratorBase& iter, const Args&... args) {
  uint64_t bits = 0;
  int next = 0;
  auto add = [&](const auto& arg) {
    if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, c10::Scalar>) {
      if (next < 3 && iter.ntensors() > 0 && !scalar_fits(arg, iter.dtype(0))) {
        bits |= uint64_t{1} << (5 + next); // above dtype_key's operand count
      }
      ++next;
    }
  };
  (add(args), ...);
  return bits;
}

template <typename Body>
struct IteratorKernel {
  KernelIterator copy;
  Body body;
  void operator()() {
    copy.run(body);
  }
};

// Launches body(copy) on the current stream of iter's device, where copy is
// KernelIterator(iter)'s iterator in the kernel (body takes an at::TensorIterator&): the launch of every
// kernel that runs CPU code over an iterator. Inside a kernel, body runs on
// `iter` itself at once; the first launch of each combination of operand
// dtypes in `seen` (one per kernel) runs in the calling thread
// (run_kernel_inline), and so does every launch when OPENREG_LAUNCH_BLOCKING=1.
template <typename Iter, typename Body>
void launch_iterator_kernel(Iter& iter, SeenDtypes& seen, const char* name, Body&& body, uint64_t more_key = 0) {
  auto here = [&] { body(iter); };
  detail::run_or_launch(iter.device().index(), name, iter.numel(), seen, dtype_key(iter) ^ more_key, here, [&] {
    return IteratorKernel<std::decay_t<Body>>{KernelIterator(iter), body};
  });
}

template <auto* stub, typename Iter, typename... Args>
struct CpuKernelOf<stub, void (*)(Iter&, Args...)> {
  static void run(Iter& iter, Args... args) {
    static SeenDtypes seen;
    launch_iterator_kernel(
        iter, seen, stub_name<stub>(),
        [... values = kernel_argument(args)](auto& it) mutable { run_cpu_stub(*stub, it, values...); },
        scalar_misfits(iter, args...));
  }
};

// CPU's impl() of a structured group (the `structured_on_cpu_aliases` route),
// launched as a kernel after meta() ran in the calling thread: in the kernel,
// impl() runs on an object of CPU's class made there, without meta()'s
// outputs (impl() takes them as arguments), its tensor arguments CPU tensors
// at kernel addresses (launch_operands_kernel). An iterator class's impl() runs on
// a copy of the iterator meta() built (KernelIterator, after
// prepare_structured_impl pointed it at kernel addresses): gelu's calls its
// CPU kernel with *this.
template <class Parent>
struct CpuImpl final : Parent {
  const at::Tensor& maybe_get_output(int64_t /*output_idx*/) override {
    TORCH_INTERNAL_ASSERT(false, "CPU's impl() asked for an output; openreg runs it without meta()");
  }
};
template <class Parent>
struct CpuIteratorImpl final : Parent {
  explicit CpuIteratorImpl(const at::TensorIteratorBase& iter) {
    static_cast<at::TensorIteratorBase&>(*this) = iter;
  }
  const at::Tensor& maybe_get_output(int64_t output_idx) override {
    return this->tensor(output_idx);
  }
};

// The queued kernel of an iterator class's impl().
template <class Parent, size_t N, typename Body>
struct IteratorImplKernel {
  KernelIterator iter;
  KernelOperands<N, /*kCpu=*/true> operands;
  Body body;
  const char* name;
  void operator()() {
    std::array<at::Tensor, N> tensors = operands.tensors();
    iter.run([&](at::TensorIterator& it) {
      CpuIteratorImpl<Parent> impl(it);
      auto with_impl = [&](std::array<at::Tensor, N>& t) { body(impl, t); };
      detail::run_on_tensors<true>(name, tensors, with_impl);
    });
  }
};

// What a structured impl()'s string arguments add to its launch key (the
// top bits, above dtype_key's operands).
uint64_t strings_key(std::initializer_list<c10::string_view> strings);

// Launches body(impl, tensors), impl a CpuImpl (or CpuIteratorImpl) of
// `Parent` and tensors the CPU tensors of `tensors`, impl()'s tensor
// arguments in order; op is the object meta() ran on.
template <class Parent, size_t N, typename Op, typename Body>
void launch_structured_cpu_impl(
    Op& op, const char* name, SeenDtypes& seen, const std::array<const at::TensorBase*, N>& tensors, Body&& body,
    uint64_t more_key = 0) {
  const c10::DeviceIndex device = tensors[N - 1]->device().index(); // an output
  const uint64_t key = ::openreg::dtype_key(tensors) ^ more_key;
  if constexpr (std::is_base_of_v<at::TensorIteratorBase, Parent>) {
    // At once, impl() runs on `op` itself, whose iterator meta() built.
    auto on_op = [&](std::array<at::Tensor, N>& t) { body(op, t); };
    auto here = [&] { detail::run_here<true>(name, tensors, on_op); };
    using Kernel = IteratorImplKernel<Parent, N, std::decay_t<Body>>;
    detail::run_or_launch(device, name, largest_numel(tensors), seen, key, here, [&]() -> Kernel {
      return Kernel{KernelIterator(op), KernelOperands<N, true>(tensors), std::forward<Body>(body), name};
    });
  } else {
    launch_operands_kernel<kCpuTensors>(
        device, name, seen, tensors,
        [body = std::forward<Body>(body)](std::array<at::Tensor, N>& cpu) {
          CpuImpl<Parent> impl;
          body(impl, cpu);
        },
        more_key);
  }
}

} // namespace openreg::native
