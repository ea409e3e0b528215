#include "OpenRegFallback.h"

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>

#include "OpenRegAllocator.h"
#include "OpenRegDevice.h"
#include "OpenRegException.h"
#include "OpenRegGenerator.h"
#include "OpenRegHostAlias.h"
#include "OpenRegStream.h"
#include "OpenRegTrace.h"

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

std::string device_name(const c10::Device& device) {
  return device.str();
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

// One run of the fallback: the device it runs on, the host aliases it made and
// the device storages it created, so that aliasing between operands and results
// is preserved in both directions.
class FallbackCall {
 public:
  FallbackCall(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : op_(op),
        schema_(op.schema()),
        stack_(*stack),
        args_begin_(stack->size() - schema_.arguments().size()) {}

  void run() {
    find_device();
    for (size_t i = 0; i < schema_.arguments().size(); ++i) {
      to_host(schema_.arguments()[i], stack_[args_begin_ + i]);
    }
    {
      std::optional<c10::DeviceGuard> guard;
      if (device_) {
        guard.emplace(*device_);
        join_current_stream(device_->index());
      }
      op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack_);
    }
    for (const Written& w : written_) {
      write_back(w);
    }
    const size_t returns = schema_.returns().size();
    for (size_t i = stack_.size() - returns; i < stack_.size(); ++i) {
      stack_[i] = map_tensors(stack_[i], [&](const at::Tensor& t) { return to_device(t); });
    }
  }

 private:
  struct Written {
    at::Tensor device_tensor;
    at::Tensor alias;
  };

  // All openreg operands must share one device; CPU operands are allowed only
  // where CUDA allows them (0-dim values, and the ops the yaml lists).
  void find_device() {
    std::optional<std::pair<c10::Device, std::string>> cpu_operand;
    bool openreg_generator = false;
    bool other_generator = false;
    for (size_t i = 0; i < schema_.arguments().size(); ++i) {
      const c10::Argument& argument = schema_.arguments()[i];
      const c10::IValue& value = stack_[args_begin_ + i];
      for_each_tensor(value, [&](const at::Tensor& t) {
        if (!t.defined()) {
          return;
        }
        if (t.device().is_privateuseone()) {
          note_device(t.device(), argument.name());
        } else if (t.is_cpu()) {
          const bool harmless = t.dim() == 0 && !is_written(argument);
          if (!harmless && !cpu_operand) {
            cpu_operand.emplace(t.device(), argument.name());
          }
        } else {
          TORCH_CHECK(
              false, op_name(), ": argument '", argument.name(), "' is a ", device_name(t.device()),
              " tensor; the openreg CPU fallback takes only openreg and CPU tensors.");
        }
      });
      if (value.isDevice() && value.toDevice().is_privateuseone()) {
        c10::Device d = value.toDevice();
        note_device(d.has_index() ? d : c10::Device(d.type(), current_device()), argument.name());
      }
      if (value.isGenerator()) {
        (value.toGenerator().device().is_privateuseone() ? openreg_generator : other_generator) = true;
      }
    }
    // As CUDA's check_generator: a CPU generator cannot drive openreg tensors.
    TORCH_CHECK(
        !device_.has_value() || !other_generator, "Expected a 'openreg' device type for generator but found 'cpu' (",
        op_name(), "): pass torch.Generator(device=\"openreg\"), or no generator.");
    TORCH_CHECK(
        device_.has_value() || !openreg_generator, op_name(),
        " got an openreg generator but runs on the CPU: pass a CPU generator, or put the "
        "tensors on openreg.");
    if (cpu_operand && device_ && !generated::op_accepts_cpu_tensors(schema_.operator_name())) {
      TORCH_CHECK(
          false, "Expected all tensors to be on the same device, but found at least two devices, ",
          device_name(*device_), " and cpu! (", op_name(), ", argument '", cpu_operand->second,
          "'). Move the tensors to one device first, e.g. with .to(\"", device_name(*device_), "\").");
    }
  }

  void note_device(c10::Device device, const std::string& argument) {
    if (!device_) {
      device_ = device;
      device_argument_ = argument;
      return;
    }
    TORCH_CHECK(
        *device_ == device,
        "Expected all tensors to be on the same device, but found at least two devices, ",
        device_name(*device_), " and ", device_name(device), "! (", op_name(), ", arguments '",
        device_argument_, "' and '", argument, "'). Move the tensors to one device first, e.g. with .to(\"",
        device_name(*device_), "\").");
  }

  void to_host(const c10::Argument& argument, c10::IValue& value) {
    const bool written = is_written(argument);
    value = map_tensors(value, [&](const at::Tensor& t) -> at::Tensor {
      if (!t.defined() || !t.device().is_privateuseone()) {
        return t;
      }
      at::Tensor alias = host_alias(t, alias_storage(t));
      alias_to_device_[alias.unsafeGetTensorImpl()] = t;
      if (written) {
        written_.push_back(Written{t, alias});
      }
      return alias;
    });
    if (value.isDevice() && value.toDevice().is_privateuseone()) {
      value = c10::Device(c10::DeviceType::CPU);
    } else if (value.isStorage() && value.toStorage().device().is_privateuseone()) {
      value = host_alias_storage(value.toStorage());
    } else if (value.isGenerator() && value.toGenerator().device().is_privateuseone()) {
      const auto& generator = value.toGenerator();
      value = generator.get<OpenRegGeneratorImpl>()->cpu_generator();
    } else if (value.isNone() && device_ && is_generator_argument(argument)) {
      // CPU kernels would draw from the CPU default generator; random ops on
      // openreg must draw from the device's own generator instead.
      value = default_generator(device_->index()).get<OpenRegGeneratorImpl>()->cpu_generator();
    }
  }

  // One host alias per device storage, so operands that share memory still
  // share it on the host and results can be traced back to their operand.
  const c10::Storage& alias_storage(const at::Tensor& t) {
    const c10::Storage& device_storage = t.storage();
    auto* key = device_storage.unsafeGetStorageImpl();
    auto it = host_storages_.find(key);
    if (it == host_storages_.end()) {
      c10::Storage alias = host_alias_storage(device_storage);
      views_of_[alias.unsafeGetStorageImpl()] = ViewBase{device_storage, t.key_set()};
      it = host_storages_.emplace(key, std::move(alias)).first;
    }
    return it->second;
  }

  // A written operand whose host alias the CPU kernel resized or restrided:
  // give the device tensor the same storage size, bytes and geometry.
  void write_back(const Written& w) {
    c10::TensorImpl* device_impl = w.device_tensor.unsafeGetTensorImpl();
    c10::TensorImpl* alias_impl = w.alias.unsafeGetTensorImpl();
    const c10::Storage& host = alias_impl->storage();
    c10::StorageImpl* device_storage = device_impl->storage().unsafeGetStorageImpl();
    const void* host_data = host.unsafeGetStorageImpl()->data_ptr().get();
    if (host_data != orKernelAddress(device_storage->data_ptr().get())) {
      // The CPU kernel resized the alias (out= of another size). Its new bytes
      // are device memory: the device storage adopts them, no copy.
      std::optional<c10::DataPtr> grown;
      if (device_storage->resizable()) {
        grown = take_grown_device_memory(host);
      }
      if (grown.has_value()) {
        device_storage->set_data_ptr_noswap(std::move(*grown));
        device_storage->set_nbytes(host.nbytes());
      } else {
        if (host.nbytes() > device_storage->nbytes()) {
          resize_storage_bytes(device_storage, host.nbytes());
        }
        OPENREG_CHECK(orMemcpy(
            device_storage->mutable_data(), host_data, host.nbytes(), orMemcpyKind::HostToDevice));
      }
    }
    if (device_impl->sizes() != alias_impl->sizes() || device_impl->strides() != alias_impl->strides() ||
        device_impl->storage_offset() != alias_impl->storage_offset()) {
      device_impl->set_sizes_and_strides(alias_impl->sizes(), alias_impl->strides(), alias_impl->storage_offset());
    }
  }

  at::Tensor to_device(const at::Tensor& t) {
    if (!t.defined() || !t.is_cpu() || !device_) {
      return t;
    }
    TORCH_CHECK_NOT_IMPLEMENTED(
        t.layout() == c10::Layout::Strided, op_name(), " produced a ", t.layout(),
        " tensor, but openreg supports only strided tensors: run this operator on CPU tensors.");
    if (auto it = alias_to_device_.find(t.unsafeGetTensorImpl()); it != alias_to_device_.end()) {
      return it->second; // the op returned an operand itself (in-place, out=)
    }
    c10::StorageImpl* host = t.storage().unsafeGetStorageImpl();
    if (auto it = views_of_.find(host); it != views_of_.end()) {
      // A view of an operand: a view of the operand's device storage, with the
      // operand's dispatch keys (as the ImplType::VIEW constructor expects).
      return device_tensor_on(it->second.storage, t, it->second.keys);
    }
    auto it = fresh_storages_.find(host);
    if (it == fresh_storages_.end()) {
      c10::DeviceGuard guard(*device_);
      c10::Storage storage(
          c10::Storage::use_byte_size_t(), host->nbytes(), device_allocator(), /*resizable=*/true);
      OPENREG_CHECK(orMemcpy(storage.mutable_data(), host->data(), host->nbytes(), orMemcpyKind::HostToDevice));
      it = fresh_storages_.emplace(host, std::move(storage)).first;
    }
    return device_tensor_on(it->second, t, std::nullopt);
  }

  // A device tensor with `like`'s geometry over `storage`: a view with `view_keys`
  // when given, otherwise a fresh tensor (whose autograd keys TensorImpl adds).
  static at::Tensor device_tensor_on(
      const c10::Storage& storage,
      const at::Tensor& like,
      std::optional<c10::DispatchKeySet> view_keys) {
    at::Tensor out = view_keys
        ? at::detail::make_tensor<c10::TensorImpl>(
              c10::TensorImpl::VIEW, c10::Storage(storage), *view_keys, like.dtype())
        : at::detail::make_tensor<c10::TensorImpl>(
              c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.dtype());
    out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
    out._set_conj(like.is_conj());
    out._set_neg(like.is_neg());
    return out;
  }

  std::string op_name() const {
    return c10::toString(schema_.operator_name());
  }

  const c10::OperatorHandle& op_;
  const c10::FunctionSchema& schema_;
  torch::jit::Stack& stack_;
  const size_t args_begin_;
  std::optional<c10::Device> device_;
  std::string device_argument_;
  std::vector<Written> written_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> host_storages_;
  struct ViewBase {
    c10::Storage storage;
    c10::DispatchKeySet keys;
  };
  std::unordered_map<c10::StorageImpl*, ViewBase> views_of_;
  std::unordered_map<c10::StorageImpl*, c10::Storage> fresh_storages_;
  std::unordered_map<c10::TensorImpl*, at::Tensor> alias_to_device_;
};

std::atomic<FallbackMode> mode{FallbackMode::Silent};

// Operators that ran through the fallback, and those already warned about.
struct Stats {
  std::mutex mutex;
  std::unordered_map<c10::OperatorName, int64_t> counts;
  std::unordered_set<c10::OperatorName> warned;
};

Stats& stats() {
  static Stats* s = new Stats(); // leaked: fallbacks may run during exit
  return *s;
}

// Counts the call; in Warn mode, warns the first time an operator falls back.
void note_fallback(const c10::OperatorName& name, FallbackMode current) {
  Stats& s = stats();
  bool first_warning = false;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    ++s.counts[name];
    if (current == FallbackMode::Warn) {
      first_warning = s.warned.insert(name).second;
    }
  }
  if (first_warning) {
    TORCH_WARN(
        c10::toString(name), " has no openreg kernel and ran on the CPU fallback (OPENREG_FALLBACK=warn "
        "warns once per operator). To run it natively, give it a kernel in backend_functions.yaml "
        "(docs/adding_an_op.md).");
  }
}

} // namespace

void set_fallback_mode(FallbackMode m) {
  mode.store(m, std::memory_order_relaxed);
  if (m == FallbackMode::Warn) {
    Stats& s = stats();
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.warned.clear(); // switching to warn warns again
  }
}

FallbackMode fallback_mode() {
  return mode.load(std::memory_order_relaxed);
}

std::vector<std::pair<std::string, int64_t>> fallback_stats() {
  Stats& s = stats();
  const std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(s.counts.size());
  for (const auto& [name, count] : s.counts) {
    out.emplace_back(c10::toString(name), count);
  }
  return out;
}

void reset_fallback_stats() {
  Stats& s = stats();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.counts.clear();
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.operator_name();
  const trace::Scope scope(name, trace::Route::Fallback);
  const FallbackMode current = fallback_mode();
  TORCH_CHECK_NOT_IMPLEMENTED(
      current != FallbackMode::Error, c10::toString(name),
      " has no openreg kernel, and OPENREG_FALLBACK=error forbids running it on the CPU fallback. "
      "Give it a kernel in backend_functions.yaml (kernels:, structured: or stubs:; see "
      "docs/adding_an_op.md), or allow the fallback with torch.openreg.set_fallback_mode(\"silent\").");
  FallbackCall(op, stack).run();
  note_fallback(name, current);
}

void raise_blocked(const c10::OperatorHandle& op, const char* reason) {
  const trace::Scope scope(op.operator_name(), trace::Route::Blocked);
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, c10::toString(op.schema().operator_name()), " is blocked on openreg: ", reason,
      " (backend_functions.yaml, fallback.blocklist). Run it on CPU tensors instead, or give it an "
      "openreg kernel in backend_functions.yaml.");
}

} // namespace openreg
