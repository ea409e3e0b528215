#include "operators/cpu/OpenRegBoxedCpuKernel.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/resize_ops.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include "memory/OpenRegAllocator.h"
#include "operators/cpu/OpenRegCpuAlias.h"
#include "operators/cpu/OpenRegCpuKernelCall.h"
#include "device/OpenRegGenerator.h"
#include "operators/OpenRegLaunch.h"
#include "operators/OpenRegRoutes.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {
namespace {

bool is_generator_argument(const c10::Argument& argument) {
  c10::TypePtr type = argument.real_type();
  if (type->kind() == c10::TypeKind::OptionalType) {
    type = type->castRaw<c10::OptionalType>()->getElementType();
  }
  return type->kind() == c10::TypeKind::GeneratorType;
}

bool is_written(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

// Calls `fn(tensor)` for a Tensor argument and for each tensor of a list argument.
template <typename Fn>
void for_each_tensor(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    fn(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor()) {
        fn(element.toTensor());
      }
    }
  }
}

// Replaces each tensor of a Tensor or list argument by `fn(tensor)`.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    return fn(value.toTensor());
  }
  if (value.isList()) {
    const c10::List<c10::IValue> list = value.toList();
    c10::impl::GenericList mapped(list.elementType());
    mapped.reserve(list.size());
    for (const c10::IValue& element : list) {
      mapped.push_back(element.isTensor() ? c10::IValue(fn(element.toTensor())) : element);
    }
    return mapped;
  }
  return value;
}

// The tensors of `values` (arguments or results) in order, list elements in
// place of their list: how a learnt result names the operand it is.
c10::SmallVector<const at::Tensor*, 8> flat_tensors(c10::ArrayRef<c10::IValue> values) {
  c10::SmallVector<const at::Tensor*, 8> out;
  for (const c10::IValue& value : values) {
    for_each_tensor(value, [&](const at::Tensor& t) { out.push_back(&t); });
  }
  return out;
}

// A tensor's conj and neg bits as one number.
int conj_neg_bits(const at::Tensor& t) {
  return t.is_conj() + 2 * t.is_neg();
}

// Where a written operand's elements are. A queued kernel may not move or
// reshape a written operand (the first call of its key did not), so the call
// that learns and the kernel both compare it before and after.
struct Placement {
  const void* data = nullptr;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  bool empty = false; // no memory yet (an at::empty({0}) out=)
  // Its conj/neg bits: linalg_lu_solve(left=False) sets the conj bit of its
  // complex out=, which a queued kernel could not give the caller's tensor.
  int bits = 0;

  static Placement of(const at::Tensor& t) {
    return {t.storage().data(), c10::SmallVector<int64_t, 5>(t.sizes().begin(), t.sizes().end()),
            c10::SmallVector<int64_t, 5>(t.strides().begin(), t.strides().end()), t.storage_offset(),
            t.storage().nbytes() == 0, conj_neg_bits(t)};
  }
  bool holds(const at::Tensor& t) const {
    return t.storage().data() == data && t.sizes().equals(sizes) && t.strides().equals(strides) &&
        t.storage_offset() == offset && conj_neg_bits(t) == bits;
  }
};

// --- What a call returns, learnt from the first call of its key ---

struct LearntResult {
  enum Kind : uint8_t { kUndefined, kOperand, kFresh };
  Kind kind = kUndefined;
  size_t operand = 0; // kOperand: the index among the call's flat_tensors
  // kFresh: the tensor's geometry over a storage of its own.
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  size_t nbytes = 0;
};

struct LearntReturns {
  // Per return on the stack: -1 for a Tensor, otherwise a tensor list's length.
  c10::SmallVector<int64_t, 2> shape;
  std::vector<LearntResult> results; // in flat_tensors order
  // Empty written operands the kernel resized (an out= a composite made with
  // at::empty({0})): by operand index, their sizes after the call; the launch
  // resizes them first.
  std::vector<std::pair<size_t, std::vector<int64_t>>> resized;
  const char* name = nullptr; // the operator, for its kernel's errors
  // A queued run returned something else: the key runs at once from then on.
  std::atomic<bool> stale{false};
};

// The key of a call: the operator, then every argument as words.
struct CallKey {
  c10::SmallVector<int64_t, 48> words;
  uint64_t hash() const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t w : words) {
      h = (h ^ static_cast<uint64_t>(w)) * 1099511628211ull;
    }
    return h;
  }
};

// Builds a CallKey; add() is false for an argument that the key cannot
// describe (a device, a nested tensor...): such calls run at once.
class KeyBuilder {
 public:
  // The thread's grad mode is part of the key, and the queued kernel runs
  // with it: CPU kernels may consult it (mkldnn_rnn_layer keeps a workspace
  // for backward only with grad enabled).
  explicit KeyBuilder(const c10::OperatorHandle& op) {
    push(reinterpret_cast<intptr_t>(&op.schema()), at::GradMode::is_enabled());
  }

  bool add(const c10::IValue& v) {
    if (v.isNone()) {
      push(1);
    } else if (v.isTensor()) {
      return add_tensor(v.toTensor());
    } else if (v.isBool()) {
      push(2, v.toBool());
    } else if (v.isInt()) {
      push(3, v.toInt());
    } else if (v.isDouble()) {
      push(4, bits(v.toDouble()));
    } else if (v.isComplexDouble()) {
      const c10::complex<double> z = v.toComplexDouble();
      push(5, bits(z.real()), bits(z.imag()));
    } else if (v.isString()) {
      const std::string& s = v.toStringRef();
      push(6, static_cast<int64_t>(s.size()));
      for (size_t i = 0; i < s.size(); i += sizeof(int64_t)) {
        int64_t w = 0;
        std::memcpy(&w, s.data() + i, std::min(sizeof(int64_t), s.size() - i));
        push(w);
      }
    } else if (v.isIntList()) {
      const auto list = v.toIntList();
      push(7, static_cast<int64_t>(list.size()));
      for (int64_t i : list) {
        push(i);
      }
    } else if (v.isDoubleList()) {
      const auto list = v.toDoubleList();
      push(8, static_cast<int64_t>(list.size()));
      for (double d : list) {
        push(bits(d));
      }
    } else if (v.isBoolList()) {
      const auto list = v.toBoolList();
      push(9, static_cast<int64_t>(list.size()));
      for (bool b : list) {
        push(b);
      }
    } else if (v.isGenerator()) {
      push(11); // results do not depend on which generator draws
    } else if (v.isList()) {
      // Tensor lists, lists of optional tensors, of scalars.
      const c10::ArrayRef<c10::IValue> list = v.toListRef();
      push(10, static_cast<int64_t>(list.size()));
      for (const c10::IValue& element : list) {
        if (!add(element)) {
          return false;
        }
      }
    } else {
      return false;
    }
    return true;
  }

  CallKey take() {
    return std::move(key_);
  }

 private:
  static int64_t bits(double d) {
    int64_t w = 0;
    std::memcpy(&w, &d, sizeof(w));
    return w;
  }
  template <typename... W>
  void push(W... w) {
    (key_.words.push_back(static_cast<int64_t>(w)), ...);
  }

  bool add_tensor(const at::Tensor& t) {
    if (!t.defined()) {
      push(20);
      return true;
    }
    const c10::Device device = t.device();
    if (t.is_nested() || t.layout() != c10::kStrided || !(device.is_privateuseone() || device.is_cpu()) ||
        seen_.size() == kMaxTensors) {
      return false;
    }
    push(21, static_cast<int64_t>(device.type()) * 256 + device.index(), static_cast<int64_t>(t.scalar_type()),
         t.dim(), conj_neg_bits(t));
    for (int64_t s : t.sizes()) {
      push(s);
    }
    for (int64_t s : t.strides()) {
      push(s);
    }
    if (device.is_cpu()) {
      // Host memory: its values are known at the launch, and may decide the
      // results' shape (lengths, sizes), as a CUDA launch reads them on the host.
      if (t.numel() > kMaxCpuElements) {
        return false;
      }
      const at::Tensor bytes = t.contiguous();
      const size_t nbytes = bytes.numel() * bytes.element_size();
      for (size_t i = 0; i < nbytes; i += sizeof(int64_t)) {
        int64_t w = 0;
        std::memcpy(&w, static_cast<const char*>(bytes.const_data_ptr()) + i, std::min(sizeof(int64_t), nbytes - i));
        push(w);
      }
    }
    // Which operands are one tensor or share memory: CPU kernels check
    // overlaps, and a result that is an operand must be that operand again.
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    push(22);
    for (size_t j = 0; j < seen_.size(); ++j) {
      if (seen_[j].first == impl) {
        push(23, j);
        break;
      }
      if (seen_[j].second == storage) {
        push(24, j, t.storage_offset(), seen_offsets_[j]);
      }
    }
    seen_.emplace_back(impl, storage);
    seen_offsets_.push_back(t.storage_offset());
    return true;
  }

  static constexpr size_t kMaxTensors = 32;
  static constexpr int64_t kMaxCpuElements = 64;
  CallKey key_;
  c10::SmallVector<std::pair<const c10::TensorImpl*, const c10::StorageImpl*>, 8> seen_;
  c10::SmallVector<int64_t, 8> seen_offsets_;
};

// Learnt returns by key. A null entry: the key's call cannot be queued (a
// result of another kind, see learn()). Cleared when operators come or go
// (keys hold a schema's address) and when full.
class ReturnsMemo {
 public:
  // Nothing if the key is not learnt yet.
  std::optional<std::shared_ptr<LearntReturns>> find(const CallKey& key) {
    const uint64_t h = key.hash();
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = buckets_.find(h);
    if (it == buckets_.end()) {
      return std::nullopt;
    }
    for (const auto& [words, returns] : it->second) {
      if (words.size() == key.words.size() && std::equal(words.begin(), words.end(), key.words.begin())) {
        return returns;
      }
    }
    return std::nullopt;
  }

  void learn(const CallKey& key, std::shared_ptr<LearntReturns> returns) {
    const uint64_t h = key.hash();
    const std::lock_guard<std::mutex> lock(mutex_);
    if (size_ >= kMaxKeys) {
      buckets_.clear();
      size_ = 0;
    }
    buckets_[h].emplace_back(std::vector<int64_t>(key.words.begin(), key.words.end()), std::move(returns));
    ++size_;
  }

  void clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    buckets_.clear();
    size_ = 0;
  }

 private:
  static constexpr size_t kMaxKeys = 8192;
  std::mutex mutex_;
  std::unordered_map<uint64_t, std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<LearntReturns>>>> buckets_;
  size_t size_ = 0;
};

class ClearOnRegistration final : public c10::OpRegistrationListener {
 public:
  explicit ClearOnRegistration(ReturnsMemo& memo) : memo_(memo) {}
  void onOperatorRegistered(const c10::OperatorHandle& /*op*/) override {
    memo_.clear();
  }
  void onOperatorDeregistered(const c10::OperatorHandle& /*op*/) override {
    memo_.clear();
  }

 private:
  ReturnsMemo& memo_;
};

ReturnsMemo& memo() {
  static ReturnsMemo* memo = [] {
    auto* m = new ReturnsMemo(); // leaked, with its listener: kernels may run at exit
    new c10::RegistrationHandleRAII(
        c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<ClearOnRegistration>(*m)));
    return m;
  }();
  return *memo;
}

// The operator's name with static storage, for orLaunchKernel.
const char* interned_name(const c10::OperatorName& name) {
  static std::mutex mutex;
  static auto* names = new std::unordered_set<std::string>(); // leaked: errors may name kernels at exit
  const std::lock_guard<std::mutex> lock(mutex);
  return names->insert(c10::toString(name)).first->c_str();
}

// Operators whose results the key cannot foretell: their shape depends on the
// operands' values (nonzero, masked_select, unique...), or they return host
// values (item, equal). And operators that draw random numbers from a
// generator they do not take as an argument (CPU's flash attention with
// dropout): the queued kernel would draw from CPU's default generator
// unordered with the host's draws. One that takes a generator (bernoulli,
// poisson...) is queued with the openreg generator's CPU generator, which
// orders it with every other use (OpenRegGenerator.h).
//
// Another library's operator needs more, which its key's first call checks
// (BoxedCpuKernelCall::learn_returns).
bool never_queued(const c10::OperatorHandle& op, Draws draws) {
  const auto& arguments = op.schema().arguments();
  return op.hasTag(at::Tag::dynamic_output_shape) || op.hasTag(at::Tag::data_dependent_output) ||
      (draws == Draws::kByTags && op.hasTag(at::Tag::nondeterministic_seeded) &&
       std::none_of(arguments.begin(), arguments.end(), is_generator_argument));
}

// An operator whose CPU kernel draws from a generator, met while the stream
// is captured into a graph: the queued kernel would draw the same numbers at
// every replay (random operators with openreg kernels draw afresh instead).
void refuse_captured_draws(const char* name) {
  TORCH_CHECK(
      false, name, " draws random numbers in CPU's kernel, on the stream, which a graph capture cannot record: each "
      "replay would draw the same numbers. Draw them before capture_begin, or leave this operator out of the "
      "captured region.");
}

bool is_torch_operator(const c10::OperatorHandle& op) {
  return op.operator_name().getNamespace() == std::optional<std::string_view>("aten");
}

bool same_geometry(const at::Tensor& t, const LearntResult& r) {
  return t.sizes().equals(r.sizes) && t.strides().equals(r.strides) && t.storage_offset() == r.offset &&
      t.dtype() == r.dtype;
}

// A queued CPU kernel: the operator's CPU kernel on views of its operands at
// kernel addresses, its fresh results planned into the memory the launch gave
// them (a result made elsewhere is copied there).
struct QueuedCpuKernel {
  c10::OperatorHandle op;
  c10::DispatchKey kernel_key;
  torch::jit::Stack stack; // the arguments
  size_t returns = 0;
  // The views of the operands, in flat_tensors order; for written ones, by
  // index, where they were.
  std::vector<at::Tensor> operands;
  c10::SmallVector<std::pair<size_t, Placement>, 2> written;
  // Per learnt result: a CPU view of its memory at kernel addresses (fresh ones).
  std::vector<KernelTensorMeta> planned;
  std::shared_ptr<LearntReturns> learnt;
  bool grad_mode = at::GradMode::is_enabled(); // the launching thread's
  // Recorded into a graph: runs once per replay, so on a copy of the
  // arguments (the call replaces them by its results).
  bool captured = false;

  void operator()() {
    const at::AutoGradMode grad(grad_mode);
    torch::jit::Stack copied;
    if (captured) {
      copied = stack;
    }
    torch::jit::Stack& arguments = captured ? copied : stack;
    c10::SmallVector<PlannedCpuAllocations::Block, 4> blocks;
    for (const KernelTensorMeta& m : planned) {
      if (m.defined && m.nbytes > 0) {
        blocks.push_back({m.data, m.nbytes});
      }
    }
    // Results not made in their planned memory.
    struct Elsewhere {
      size_t result;
      at::Tensor tensor;
      bool in_planned; // in another result's
    };
    std::vector<Elsewhere> elsewhere;
    {
      const PlannedCpuAllocations planning(std::move(blocks));
      {
        // CPU's warnings for these operands came from the call that ran at
        // once; a kernel has no Python to warn.
        const c10::WarningUtils::WarningHandlerGuard quiet(&no_warnings());
        op.redispatchBoxed(c10::DispatchKeySet(kernel_key), &arguments);
      }
      for (const auto& [k, placement] : written) {
        TORCH_CHECK(
            placement.holds(operands[k]), learnt->name,
            ": the CPU kernel resized or moved a written operand, which a queued kernel cannot do (the first call "
            "with these shapes did not). This is an openreg bug; OPENREG_LAUNCH_BLOCKING=1 runs every kernel at once.");
      }
      const c10::SmallVector<const at::Tensor*, 8> results =
          flat_tensors(torch::jit::last(arguments, returns));
      TORCH_INTERNAL_ASSERT(results.size() == learnt->results.size());
      for (size_t i = 0; i < results.size(); ++i) {
        const at::Tensor& t = *results[i];
        const LearntResult& r = learnt->results[i];
        if (r.kind == LearntResult::kUndefined) {
          check(!t.defined(), t, r);
        } else if (r.kind == LearntResult::kOperand) {
          check(t.unsafeGetTensorImpl() == operands[r.operand].unsafeGetTensorImpl(), t, r);
        } else {
          check(t.defined() && t.sizes().equals(r.sizes) && t.dtype() == r.dtype, t, r);
          if (t.storage().data() != planned[i].data || !same_geometry(t, r)) {
            elsewhere.push_back({i, t, planning.inside(t.storage().data())});
          }
        }
      }
    }
    // A result made in another result's planned memory moves out first.
    for (Elsewhere& e : elsewhere) {
      if (e.in_planned) {
        e.tensor = e.tensor.clone();
      }
    }
    for (const Elsewhere& e : elsewhere) {
      kernel_view(planned[e.result]).copy_(e.tensor);
    }
  }

  void check(bool as_learnt, const at::Tensor& t, const LearntResult& r) {
    if (as_learnt) {
      return;
    }
    learnt->stale.store(true);
    const std::string got = t.defined() ? c10::str(t.sizes(), " ", t.dtype()) : "an undefined tensor";
    const std::string expected = r.kind == LearntResult::kFresh ? c10::str(r.sizes, " ", r.dtype)
        : r.kind == LearntResult::kOperand                       ? std::string("one of its operands")
                                                                 : std::string("an undefined tensor");
    TORCH_CHECK(
        false, learnt->name, " returned ", got, " where its first call with operands of the same shapes returned ",
        expected, ": its result depends on the operands' values, which openreg cannot know when it queues the "
        "kernel, so the tensor the call returned is wrong. This is an openreg bug (the operator needs the "
        "dynamic_output_shape tag or an openreg kernel); OPENREG_LAUNCH_BLOCKING=1 runs it at once, correctly.");
  }

  static c10::WarningHandler& no_warnings() {
    struct Drop final : c10::WarningHandler {
      void process(const c10::Warning& /*warning*/) override {}
    };
    static Drop drop;
    return drop;
  }
};

// One call: a CpuKernelCall (OpenRegCpuKernelCall.h) driven by the
// operator's schema over the boxed stack, run at once or queued.
class BoxedCpuKernelCall {
 public:
  BoxedCpuKernelCall(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKey kernel_key, Draws draws)
      : op_(op),
        kernel_key_(kernel_key),
        draws_(draws),
        schema_(op.schema()),
        stack_(*stack),
        args_begin_(stack->size() - schema_.arguments().size()),
        call_(schema_.operator_name(), accepts_cpu_tensors(schema_.operator_name())) {}

  void run() {
    if (returns_cpu_tensors(schema_.operator_name())) {
      call_.keep_results_on_cpu();
    }
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      note(arguments[i], stack_[args_begin_ + i]);
    }
    std::optional<CallKey> key;
    if (call_.may_queue() && !never_queued(op_, draws_)) {
      call_.check(); // the argument errors CpuKernelCall raises come from the call
      key = call_key();
      if (key.has_value()) {
        if (std::optional<std::shared_ptr<LearntReturns>> found = memo().find(*key)) {
          if (*found != nullptr && !(*found)->stale.load(std::memory_order_relaxed)) {
            launch(std::move(*found));
            return;
          }
          key.reset(); // a call that runs at once
        }
      }
    }
    if (!key.has_value()) {
      run_here();
      return;
    }
    if (current_stream_capturing(call_.where()->index())) {
      learn_in_capture(*key);
      return;
    }
    memo().learn(*key, learn_returns());
  }

 private:
  // Runs the call here and learns what calls of its key return: what the
  // operands are before the call, what it returned after (null if they
  // cannot be queued).
  std::shared_ptr<LearntReturns> run_and_learn() {
    std::vector<at::Tensor> operands;
    for (const at::Tensor* t : flat_tensors(arguments_on_stack())) {
      operands.push_back(*t);
    }
    c10::SmallVector<std::pair<size_t, Placement>, 2> written_before;
    for (size_t k : written_operands()) {
      written_before.emplace_back(k, Placement::of(operands[k]));
    }
    run_here();
    return learnt(operands, written_before);
  }

  // What calls of the key return, from this call run here; null if they
  // cannot be queued. Another library's operator is queued only when
  //  - its CPU kernel is C++: one written in Python would need the GIL on the
  //    stream's worker, and
  //  - its Meta kernel, run on meta copies of the operands, gives results of
  //    the sizes the call returned: then they follow from the operands' shapes.
  //    A library need not tag an operator whose results' shape depends on
  //    the values (torchvision's nms is not); its fake kernel asks for a
  //    dynamic size, which raises on meta tensors, or it has no Meta kernel.
  // Decided at the key's first call: a kernel registered later for the
  // operator does not change it.
  std::shared_ptr<LearntReturns> learn_returns() {
    if (is_torch_operator(op_)) {
      return run_and_learn();
    }
    std::optional<torch::jit::Stack> meta;
    if (cpu_kernel_in_cpp()) {
      meta = meta_results();
    }
    std::shared_ptr<LearntReturns> returns = run_and_learn();
    return meta.has_value() && meta_agrees(*meta) ? returns : nullptr;
  }

  // Whether the kernel the call runs is C++: the dispatcher marks a kernel it
  // can call unboxed (a C++ function), and says so only in its dump. A Python
  // kernel is boxed only.
  bool cpu_kernel_in_cpp() const {
    const std::string state = op_.dumpState();
    const std::string line = "\n" + std::string(c10::toString(kernel_key_)) + ": ";
    const size_t begin = state.find(line); // the first is the one that runs
    if (begin == std::string::npos) {
      return false;
    }
    const size_t end = state.find('\n', begin + 1);
    return state.substr(begin, end - begin).find("[ boxed unboxed ]") != std::string::npos;
  }

  // The stack after the operator's Meta kernel ran on meta copies of the
  // device operands (host ones as they are); nothing if it raised.
  std::optional<torch::jit::Stack> meta_results() const {
    torch::jit::Stack meta;
    for (const c10::IValue& value : arguments_on_stack()) {
      meta.push_back(map_tensors(value, [](const at::Tensor& t) {
        return t.defined() && t.device().is_privateuseone()
            ? at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta))
            : t;
      }));
    }
    try {
      op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    return meta;
  }

  // Whether the Meta kernel's results have the sizes of the results on the
  // stack (not always their dtypes: quantized::embedding_bag_byte_prepack's
  // Meta kernel returns float for uint8).
  bool meta_agrees(const torch::jit::Stack& meta) const {
    const size_t returns = schema_.returns().size();
    const c10::SmallVector<const at::Tensor*, 8> expected = flat_tensors(torch::jit::last(meta, returns));
    const c10::SmallVector<const at::Tensor*, 8> got = flat_tensors(torch::jit::last(stack_, returns));
    return got.size() == expected.size() &&
        std::equal(got.begin(), got.end(), expected.begin(), [](const at::Tensor* a, const at::Tensor* b) {
             return a->defined() == b->defined() &&
                 (!a->defined() || a->sizes().equals(b->sizes()));
           });
  }

  // The first call with `key` while the stream is captured into a graph: the
  // call cannot wait for the stream, and the work recorded before it has not
  // run. It runs here on the memory as it is, its written operands replaced
  // by fresh tensors of their geometry (so nothing the capture's replays
  // will read changes), to learn its results' shapes (its results are
  // dropped); then the call is recorded as a later one would be.
  void learn_in_capture(const CallKey& key) {
    const char* name = interned_name(schema_.operator_name());
    const auto& parameters = schema_.arguments();
    if (std::any_of(parameters.begin(), parameters.end(), is_generator_argument)) {
      refuse_captured_draws(name);
    }
    const torch::jit::Stack arguments(stack_.begin() + static_cast<std::ptrdiff_t>(args_begin_), stack_.end());
    c10::SmallVector<const c10::TensorImpl*, 2> written;
    {
      const c10::SmallVector<const at::Tensor*, 8> flat = flat_tensors(arguments_on_stack());
      for (size_t k : written_operands()) {
        written.push_back(flat[k]->unsafeGetTensorImpl());
      }
    }
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (is_written(parameters[i])) {
        c10::IValue& value = stack_[args_begin_ + i];
        value = map_tensors(value, [&](const at::Tensor& t) -> at::Tensor {
          if (std::find(written.begin(), written.end(), t.unsafeGetTensorImpl()) == written.end()) {
            return t;
          }
          return t.storage().nbytes() == 0 ? at::empty({0}, t.options())
                                           : at::empty_strided(t.sizes(), t.strides(), t.options());
        });
      }
    }
    call_.run_without_waiting();
    std::shared_ptr<LearntReturns> returns;
    try {
      returns = learn_returns();
    } catch (const c10::Error& e) {
      TORCH_CHECK(
          false, name, " ran during a graph's capture, on values the capture has not computed yet, to learn its "
          "results' shapes, and failed: ", e.what_without_backtrace(), "\nRun the captured code once before "
          "capturing (a warm-up on a side stream, as CUDA asks).");
    }
    TORCH_CHECK(
        returns != nullptr, name, ": its results cannot be planned (they share memory with its operands, or are "
        "not strided)",
        is_torch_operator(op_) ? "" : ", or, as another library's operator, it has no C++ CPU kernel or no Meta "
        "kernel that gives its results' shapes",
        ", so it cannot be recorded into a graph.");
    memo().learn(key, returns);
    stack_.resize(args_begin_);
    stack_.insert(stack_.end(), arguments.begin(), arguments.end());
    launch(std::move(returns));
  }

  c10::ArrayRef<c10::IValue> arguments_on_stack() const {
    return c10::ArrayRef<c10::IValue>(stack_).slice(args_begin_, schema_.arguments().size());
  }

  void note(const c10::Argument& argument, const c10::IValue& value) {
    const char* name = argument.name().c_str();
    const bool written = is_written(argument);
    for_each_tensor(value, [&](const at::Tensor& t) { call_.note(t, name, written); });
    if (value.isDevice()) {
      call_.note(std::optional<at::Device>(value.toDevice()), name);
    } else if (value.isGenerator()) {
      call_.note(std::optional<at::Generator>(value.toGenerator()), name);
    }
  }

  std::optional<CallKey> call_key() const {
    KeyBuilder builder(op_);
    for (const c10::IValue& value : arguments_on_stack()) {
      if (!builder.add(value)) {
        return std::nullopt;
      }
    }
    return builder.take();
  }

  void run_here() {
    call_.begin();
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      to_cpu_aliases(arguments[i], stack_[args_begin_ + i]);
    }
    op_.redispatchBoxed(c10::DispatchKeySet(kernel_key_), &stack_);
    call_.finish();
    const size_t returns = schema_.returns().size();
    for (size_t i = stack_.size() - returns; i < stack_.size(); ++i) {
      stack_[i] = map_tensors(stack_[i], [&](const at::Tensor& t) { return call_.result(t); });
    }
  }

  void to_cpu_aliases(const c10::Argument& argument, c10::IValue& value) {
    if (is_written(argument)) {
      value = map_tensors(value, [&](const at::Tensor& t) { return call_.written(t); });
    } else {
      value = map_tensors(value, [&](const at::Tensor& t) { return call_.alias(t); });
    }
    if (value.isDevice()) {
      value = *call_.device(value.toDevice());
    } else if (value.isStorage()) {
      value = call_.alias(value.toStorage());
    } else if (value.isGenerator()) {
      value = *call_.generator(value.toGenerator());
    } else if (value.isNone() && is_generator_argument(argument)) {
      if (std::optional<at::Generator> generator = call_.generator(std::nullopt)) {
        value = *generator;
      }
    }
  }

  // --- learning ---

  // The written operands that are tensors, by index among flat_tensors.
  c10::SmallVector<size_t, 2> written_operands() const {
    c10::SmallVector<size_t, 2> out;
    const auto& arguments = schema_.arguments();
    size_t k = 0;
    for (size_t i = 0; i < arguments.size(); ++i) {
      for_each_tensor(stack_[args_begin_ + i], [&](const at::Tensor& t) {
        if (is_written(arguments[i]) && t.defined()) {
          out.push_back(k);
        }
        ++k;
      });
    }
    return out;
  }

  // What the call that just ran returned, for later calls of its key; null if
  // they cannot be queued: the kernel resized or moved a written operand that
  // had memory, or returned a view of an operand, results sharing memory, or
  // something other than tensors and tensor lists.
  std::shared_ptr<LearntReturns> learnt(
      const std::vector<at::Tensor>& operands,
      const c10::SmallVector<std::pair<size_t, Placement>, 2>& written_before) const {
    auto out = std::make_shared<LearntReturns>();
    for (const auto& [k, before] : written_before) {
      const at::Tensor& t = operands[k];
      if (before.empty && t.is_contiguous() && t.storage_offset() == 0 && conj_neg_bits(t) == before.bits) {
        out->resized.emplace_back(k, t.sizes().vec()); // what resize_ makes of it
      } else if (!before.holds(t)) {
        return nullptr;
      }
    }
    out->name = interned_name(schema_.operator_name());
    const c10::ArrayRef<c10::IValue> returns = torch::jit::last(stack_, schema_.returns().size());
    for (const c10::IValue& value : returns) {
      if (value.isTensor()) {
        out->shape.push_back(-1);
      } else if (value.isTensorList()) {
        out->shape.push_back(static_cast<int64_t>(value.toListRef().size()));
      } else {
        return nullptr;
      }
    }
    c10::SmallVector<const c10::StorageImpl*, 4> fresh_storages;
    for (const at::Tensor* t : flat_tensors(returns)) {
      std::optional<LearntResult> r = learnt_result(*t, operands, fresh_storages);
      if (!r.has_value()) {
        return nullptr;
      }
      out->results.push_back(std::move(*r));
    }
    return out;
  }

  static std::optional<LearntResult> learnt_result(
      const at::Tensor& t,
      const std::vector<at::Tensor>& operands,
      c10::SmallVector<const c10::StorageImpl*, 4>& fresh_storages) {
    LearntResult r;
    if (!t.defined()) {
      return r;
    }
    for (size_t k = 0; k < operands.size(); ++k) {
      if (operands[k].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        r.kind = LearntResult::kOperand;
        r.operand = k;
        return r;
      }
    }
    if (t.layout() != c10::kStrided) {
      return std::nullopt; // a sparse result (to_sparse of dense operands): no storage to plan
    }
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    const bool shares = std::any_of(operands.begin(), operands.end(), [&](const at::Tensor& o) {
      return o.defined() && o.storage().unsafeGetStorageImpl() == storage;
    }) || std::find(fresh_storages.begin(), fresh_storages.end(), storage) != fresh_storages.end();
    if (shares || !t.device().is_privateuseone() || t.is_nested() || t.layout() != c10::kStrided || t.is_conj() ||
        t.is_neg()) {
      return std::nullopt;
    }
    fresh_storages.push_back(storage);
    r.kind = LearntResult::kFresh;
    r.sizes.assign(t.sizes().begin(), t.sizes().end());
    r.strides.assign(t.strides().begin(), t.strides().end());
    r.offset = t.storage_offset();
    r.dtype = t.dtype();
    r.nbytes = t.storage().nbytes();
    return r;
  }

  // --- launching ---

  void launch(std::shared_ptr<LearntReturns> learnt) {
    const c10::DeviceIndex device = call_.where()->index();
    const auto& arguments = schema_.arguments();
    const c10::SmallVector<const at::Tensor*, 8> operands = flat_tensors(arguments_on_stack());
    for (const auto& [k, sizes] : learnt->resized) {
      at::_ops::resize_::call(*operands[k], c10::fromIntArrayRefSlow(sizes), std::nullopt);
    }
    // The results, in the caller's order, and the kernel's plan of them.
    std::vector<at::Tensor> results;
    std::vector<KernelTensorMeta> planned;
    for (const LearntResult& r : learnt->results) {
      if (r.kind == LearntResult::kOperand) {
        results.push_back(*operands[r.operand]);
        planned.emplace_back();
      } else if (r.kind == LearntResult::kFresh) {
        results.push_back(fresh_result(device, r));
        planned.push_back(kernel_cpu_tensor_meta(results.back()));
      } else {
        results.emplace_back();
        planned.emplace_back();
      }
    }
    OpenRegGeneratorImpl* drawing = nullptr; // the generator the kernel draws from
    launch_kernel_made(device, learnt->name, [&]() -> QueuedCpuKernel {
      QueuedCpuKernel kernel{op_, kernel_key_, {}, schema_.returns().size(), {}, {}, std::move(planned), learnt};
      kernel.captured = current_stream_capturing(device);
      // The operands as views at kernel addresses (CPU ones copied): one per
      // distinct tensor, one storage per device storage.
      std::vector<std::pair<const c10::StorageImpl*, c10::Storage>> storages;
      std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> views;
      auto view_of = [&](const at::Tensor& t) -> at::Tensor {
        for (const auto& [impl, view] : views) {
          if (impl == t.unsafeGetTensorImpl()) {
            return view;
          }
        }
        at::Tensor view;
        if (!t.defined() || !t.device().is_privateuseone()) {
          view = kernel_tensor_argument(t);
        } else {
          const KernelTensorMeta meta = kernel_cpu_tensor_meta(t);
          const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
          auto shared = std::find_if(storages.begin(), storages.end(), [&](const auto& s) { return s.first == storage; });
          view = shared != storages.end() ? kernel_view(meta, shared->second) : kernel_view(meta);
          if (shared == storages.end()) {
            storages.emplace_back(storage, view.storage());
          }
        }
        views.emplace_back(t.unsafeGetTensorImpl(), view);
        return view;
      };
      kernel.stack.reserve(arguments.size() + schema_.returns().size());
      for (size_t i = 0; i < arguments.size(); ++i) {
        const c10::IValue& value = stack_[args_begin_ + i];
        if (is_generator_argument(arguments[i])) {
          if (kernel.captured) {
            refuse_captured_draws(learnt->name);
          }
          drawing = &openreg_generator_for(value.toOptional<at::Generator>(), device, learnt->name);
          drawing->order_queued_draw(current_raw_stream(device));
          kernel.stack.emplace_back(drawing->cpu_generator());
        } else {
          kernel.stack.push_back(map_tensors(value, view_of));
        }
      }
      kernel.operands.reserve(operands.size());
      for (const at::Tensor* t : operands) {
        kernel.operands.push_back(view_of(*t));
      }
      for (size_t k : written_operands()) {
        kernel.written.emplace_back(k, Placement::of(kernel.operands[k]));
      }
      return kernel;
    });
    if (drawing != nullptr) {
      drawing->draw_queued(current_raw_stream(device));
    }
    // The caller's stack: its arguments out, the results in.
    torch::jit::drop(stack_, arguments.size());
    size_t next = 0;
    for (int64_t n : learnt->shape) {
      if (n < 0) {
        stack_.emplace_back(std::move(results[next++]));
      } else {
        c10::List<at::Tensor> list;
        list.reserve(n);
        for (int64_t j = 0; j < n; ++j) {
          list.push_back(std::move(results[next++]));
        }
        stack_.emplace_back(std::move(list));
      }
    }
  }

  static at::Tensor fresh_result(c10::DeviceIndex device, const LearntResult& r) {
    c10::Storage storage(
        c10::Storage::use_byte_size_t(), r.nbytes, allocate_on(device, r.nbytes), device_allocator(),
        /*resizable=*/true);
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), r.dtype);
    t.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes, r.strides, r.offset);
    return t;
  }

  const c10::OperatorHandle& op_;
  const c10::DispatchKey kernel_key_;
  const Draws draws_;
  const c10::FunctionSchema& schema_;
  torch::jit::Stack& stack_;
  const size_t args_begin_;
  CpuKernelCall call_;
};

} // namespace

void run_cpu_kernel_boxed(
    const c10::OperatorHandle& op,
    torch::jit::Stack* stack,
    c10::DispatchKey kernel_key,
    Draws draws) {
  BoxedCpuKernelCall(op, stack, kernel_key, draws).run();
}

c10::OperatorHandle cpu_kernel_operator(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

void detail::boxed_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_cpu_kernel_boxed(op, stack, c10::DispatchKey::CPU);
}

void detail::boxed_cpu_kernel_drawing_nothing(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_cpu_kernel_boxed(op, stack, c10::DispatchKey::CPU, Draws::kNone);
}

} // namespace openreg
