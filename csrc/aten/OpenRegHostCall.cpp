#include "OpenRegHostCall.h"

#include <algorithm>
#include <cstring>

#include <ATen/NestedTensorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include "OpenRegAllocator.h"
#include "OpenRegDevice.h"
#include "OpenRegException.h"
#include "OpenRegGenerator.h"
#include "OpenRegHostAlias.h"
#include "OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {
namespace {

// The device whose memory this thread's CPU allocations come from while a
// HostCall runs its kernel, or -1.
thread_local c10::DeviceIndex redirect_device = -1;

// torch's CPU allocator with one change: while a HostCall runs a CPU kernel on
// this thread, allocations come from the call's openreg device
// (allocate_host_visible), so the kernel's results are device memory and
// HostCall::result adopts them instead of copying. Elsewhere, and on the
// threads of a parallel region, it is the allocator it replaced.
class RedirectingCPUAllocator final : public c10::Allocator {
 public:
  explicit RedirectingCPUAllocator(c10::Allocator* cpu) : cpu_(cpu) {
    cpu_raw_deleter() = cpu->raw_deleter();
  }

  c10::DataPtr allocate(size_t nbytes) override {
    if (redirect_device >= 0) {
      return allocate_host_visible(redirect_device, nbytes);
    }
    return cpu_->allocate(nbytes);
  }

  // Allocator::raw_deallocate frees raw_allocate()'s pointers through this
  // deleter, whichever allocation they came from.
  c10::DeleterFnPtr raw_deleter() const override {
    return cpu_raw_deleter() != nullptr ? &raw_delete : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    cpu_->copy_data(dest, src, count);
  }

 private:
  static c10::DeleterFnPtr& cpu_raw_deleter() {
    static c10::DeleterFnPtr deleter = nullptr;
    return deleter;
  }

  static void raw_delete(void* data) {
    if (!release_host_visible(data)) {
      cpu_raw_deleter()(data);
    }
  }

  c10::Allocator* cpu_;
};

// Installed when the extension loads, above the priority c10 registers its
// own CPU allocator with.
const bool installed = [] {
  static RedirectingCPUAllocator allocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&allocator, /*priority=*/1);
  return true;
}();

// Moves a tensor whose storage now holds device memory to that device.
// TensorImpl::set_storage_keep_dtype(t.storage()) does it by reassigning the
// tensor's own storage, two reference-count changes (atomic operations) for
// nothing; a pointer to the protected member, formed through a derived class as
// C++ allows, sets the device alone, as that function's second line does.
struct DeviceOfTensorImpl : c10::TensorImpl {
  static constexpr std::optional<c10::Device> c10::TensorImpl::*device = &DeviceOfTensorImpl::device_opt_;
};

void move_to_storage_device(c10::TensorImpl& impl) {
  impl.*DeviceOfTensorImpl::device = impl.storage().device();
}

// Calls f with each element of a list of optional tensors, as a pointer to the
// list's own tensor (null for None). Iterating a c10::List converts each
// element into a temporary std::optional<at::Tensor>, a copy that changes the
// reference count of a tensor Python holds through the interpreter.
template <class F>
void for_each_tensor(const c10::List<std::optional<at::Tensor>>& tensors, F&& f) {
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const c10::IValue& element = (*it).get();
    f(element.isNone() ? nullptr : &element.toTensor());
  }
}

} // namespace

// A list for HostCall::host(list), reused by the next call on the thread when
// the kernel did not keep it.
struct SpareList {
  c10::List<std::optional<at::Tensor>> list;
  bool in_use = false;
};

namespace {

SpareList& spare_list() {
  thread_local SpareList spare;
  return spare;
}

std::string device_name(const c10::Device& device) {
  return device.str();
}

// A device tensor with `like`'s geometry over `storage`: a view with
// `view_keys` when given, otherwise a fresh tensor (whose autograd keys
// TensorImpl adds).
at::Tensor device_tensor_on(
    const c10::Storage& storage,
    const at::Tensor& like,
    std::optional<c10::DispatchKeySet> view_keys) {
  at::Tensor out = view_keys ? at::detail::make_tensor<c10::TensorImpl>(
                                   c10::TensorImpl::VIEW, c10::Storage(storage), *view_keys, like.dtype())
                             : at::detail::make_tensor<c10::TensorImpl>(
                                   c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  out._set_conj(like.is_conj());
  out._set_neg(like.is_neg());
  return out;
}

} // namespace

HostCall::HostCall(const char* op, bool accepts_cpu_tensors)
    : op_(op), accepts_cpu_tensors_(accepts_cpu_tensors), borrows_operands_(true) {
  (void)installed;
}

HostCall::HostCall(const c10::OperatorName& op, bool accepts_cpu_tensors)
    : op_name_(&op), accepts_cpu_tensors_(accepts_cpu_tensors), borrows_operands_(false) {}

std::string HostCall::op_name() const {
  return op_name_ != nullptr ? c10::toString(*op_name_) : std::string(op_);
}

HostCall::~HostCall() {
  if (redirecting_) {
    redirect_device = previous_redirect_;
  }
  written_.clear(); // (finish() did, unless the kernel threw)
  // The lists hold references to operand aliases: drop them before the
  // aliases end. A list the kernel kept (c10::List shares its elements) is
  // left to it, and the spare is replaced.
  if (spare_list_ != nullptr) {
    if (spare_list_->list.use_count() == 1) {
      spare_list_->list.clear();
    } else {
      spare_list_->list = c10::List<std::optional<at::Tensor>>();
    }
    spare_list_->in_use = false;
  }
  more_lists_.clear();
  if (pool_ == nullptr) {
    return; // no operand had a host alias
  }
  // The CPU kernel's tensors are gone: host alias objects nothing kept are
  // reused by the next call on this thread. Aliases sharing a storage end
  // before the one that made it, which decides what becomes of the storage.
  auto end = [&](Operand& o) {
    if (o.first_on_storage && o.pooled) {
      end_operand_alias(std::move(o.alias), o.device_storage, *pool_);
    } else {
      o.alias.reset();
    }
  };
  for (auto it = more_operands_.rbegin(); it != more_operands_.rend(); ++it) {
    end(*it);
  }
  for (auto it = operands_.rbegin(); it != operands_.rend(); ++it) {
    end(*it);
  }
}

void HostCall::note_device(c10::Device device, const char* argument) {
  if (!device_) {
    device_ = device;
    device_argument_ = argument;
    return;
  }
  if (*device_ != device) {
    raise_two_devices(op_name(), *device_, device_argument_, device, argument);
  }
}

void raise_two_devices(
    const std::string& op,
    c10::Device first,
    const char* first_argument,
    c10::Device second,
    const char* second_argument) {
  const std::string arguments = std::strcmp(first_argument, second_argument) == 0
      ? "argument '" + std::string(first_argument) + "'"
      : "arguments '" + std::string(first_argument) + "' and '" + second_argument + "'";
  TORCH_CHECK(
      false, "Expected all tensors to be on the same device, but found at least two devices, ", device_name(first),
      " and ", device_name(second), "! (", op, ", ", arguments, "). Move the tensors to one device first, e.g. with .to(\"",
      device_name(first), "\").");
}

void HostCall::note(const at::Tensor& t, const char* argument, bool written) {
  if (!t.defined()) {
    return;
  }
  if (t.device().is_privateuseone()) {
    note_device(t.device(), argument);
  } else if (t.is_cpu()) {
    const bool harmless = t.dim() == 0 && !written;
    if (!harmless && cpu_argument_ == nullptr) {
      cpu_argument_ = argument;
    }
  } else {
    TORCH_CHECK(
        false, op_name(), ": argument '", argument, "' is a ", device_name(t.device()),
        " tensor; openreg runs CPU kernels on openreg and CPU tensors only.");
  }
}

void HostCall::note(const std::optional<at::Tensor>& t, const char* argument) {
  if (t.has_value()) {
    note(*t, argument);
  }
}

void HostCall::note(at::ITensorListRef tensors, const char* argument) {
  for (const at::Tensor& t : tensors) {
    note(t, argument);
  }
}

void HostCall::note(const c10::List<std::optional<at::Tensor>>& tensors, const char* argument) {
  for_each_tensor(tensors, [&](const at::Tensor* t) {
    if (t != nullptr) {
      note(*t, argument);
    }
  });
}

void HostCall::note(const std::optional<at::Device>& device, const char* argument) {
  if (device.has_value() && device->is_privateuseone()) {
    note_device(device->has_index() ? *device : c10::Device(device->type(), current_device()), argument);
  } else if (device.has_value() && device->is_cpu()) {
    cpu_results_ = true;
  }
}

void HostCall::note(const std::optional<at::Generator>& generator, const char* /*argument*/) {
  if (generator.has_value() && generator->defined()) {
    (generator->device().is_privateuseone() ? openreg_generator_ : other_generator_) = true;
  }
}

void HostCall::begin() {
  // As CUDA's check_generator: a CPU generator cannot drive openreg tensors.
  TORCH_CHECK(
      !device_.has_value() || !other_generator_, "Expected a 'openreg' device type for generator but found 'cpu' (",
      op_name(), "): pass torch.Generator(device=\"openreg\"), or no generator.");
  TORCH_CHECK(
      device_.has_value() || !openreg_generator_, op_name(),
      " got an openreg generator but runs on the CPU: pass a CPU generator, or put the tensors on openreg.");
  if (cpu_argument_ != nullptr && device_ && !accepts_cpu_tensors_) {
    raise_two_devices(op_name(), *device_, cpu_argument_, c10::Device(c10::DeviceType::CPU), cpu_argument_);
  }
  if (!device_) {
    return; // CPU tensors only (a fallback reached through a CPU generator or storage)
  }
  if (peek_current_device() != device_->index()) {
    guard_.emplace(*device_);
  }
  join_current_stream(device_->index());
  if (cpu_results_) {
    return; // the results belong to the CPU: its allocator stays as it is
  }
  previous_redirect_ = redirect_device;
  redirect_device = device_->index();
  redirecting_ = true;
}

HostCall::Operand& HostCall::add_operand(Operand&& operand) {
  if (operands_.size() < kInlineOperands) {
    return operands_.emplace_back(std::move(operand));
  }
  return more_operands_.emplace_back(std::move(operand));
}

const at::Tensor& HostCall::host(const at::Tensor& t) {
  return host(t, borrows_operands_);
}

const at::Tensor& HostCall::host(const at::Tensor& t, bool borrow) {
  if (!t.defined() || !t.device().is_privateuseone()) {
    return t;
  }
  c10::StorageImpl* device_storage = t.storage().unsafeGetStorageImpl();
  const at::Tensor* known = nullptr;
  const at::Tensor* same_storage = nullptr;
  for_each_operand([&](const Operand& o) {
    if (o.device->unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      known = &o.alias;
    } else if (o.first_on_storage && o.device_storage == device_storage) {
      same_storage = &o.alias;
    }
  });
  if (known != nullptr) {
    return *known;
  }
  if (t.is_nested()) {
    // A NestedTensorCPU view of the same bytes, for torch's nested CPU kernels.
    const c10::Storage host_storage = same_storage != nullptr ? same_storage->storage() : host_alias_storage(t.storage());
    return add_operand(Operand{
                           nested_tensor_on(host_storage, t), keep(t, borrow), device_storage, same_storage == nullptr,
                           /*pooled=*/false})
        .alias;
  }
  if (same_storage != nullptr) {
    return add_operand(Operand{host_alias(t, same_storage->storage()), keep(t, borrow), device_storage, false}).alias;
  }
  return add_operand(Operand{operand_alias(t, pool()), keep(t, borrow), device_storage, true}).alias;
}

at::Tensor HostCall::written(const at::Tensor& t) {
  at::Tensor alias = host(t);
  const bool known = std::any_of(written_.begin(), written_.end(), [&](const Written& w) {
    return w.device_tensor->unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
  });
  if (t.defined() && t.device().is_privateuseone() && !known) {
    written_.push_back(Written{keep(t, borrows_operands_), alias});
  }
  return alias;
}

std::optional<at::Tensor> HostCall::host(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) {
    return std::nullopt;
  }
  return host(*t);
}

HostTensors HostCall::host(at::ITensorListRef tensors) {
  HostTensors out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    out.push_back(host(t));
  }
  return out;
}

const c10::List<std::optional<at::Tensor>>& HostCall::host(const c10::List<std::optional<at::Tensor>>& tensors) {
  c10::List<std::optional<at::Tensor>>* list = nullptr;
  SpareList& spare = spare_list();
  if (spare_list_ == nullptr && !spare.in_use) {
    spare.in_use = true;
    spare_list_ = &spare;
    list = &spare.list;
  } else {
    list = &more_lists_.emplace_back();
  }
  c10::List<std::optional<at::Tensor>>& out = *list;
  out.reserve(tensors.size());
  for_each_tensor(tensors, [&](const at::Tensor* t) {
    out.push_back(t != nullptr ? std::optional<at::Tensor>(host(*t)) : std::nullopt);
  });
  return out;
}

c10::Storage HostCall::host(const c10::Storage& storage) {
  return storage.device().is_privateuseone() ? host_alias_storage(storage) : storage;
}

std::optional<at::Device> HostCall::device(const std::optional<at::Device>& device) const {
  if (device.has_value() && device->is_privateuseone()) {
    return c10::Device(c10::DeviceType::CPU);
  }
  return device;
}

std::optional<at::Generator> HostCall::generator(const std::optional<at::Generator>& generator) const {
  const bool given = generator.has_value() && generator->defined();
  // A CPU generator stays as it is (begin() let it through for CPU tensors
  // only), and so does no generator on a call without an openreg device.
  if (given ? !generator->device().is_privateuseone() : !device_.has_value()) {
    return generator;
  }
  // An openreg generator, or none: cpu_generator_for raises only for other
  // devices, so its operator name is never shown here.
  return cpu_generator_for(generator, given ? generator->device().index() : device_->index(), "");
}

void HostCall::finish() {
  if (redirecting_) {
    redirect_device = previous_redirect_;
    redirecting_ = false;
  }
  guard_.reset();
  for (const Written& w : written_) {
    write_back(w);
  }
  written_.clear();
}

// A written operand whose host alias the CPU kernel resized or restrided: give
// the device tensor the same storage size, bytes and geometry.
void HostCall::write_back(const Written& w) {
  c10::TensorImpl* device_impl = w.device_tensor->unsafeGetTensorImpl();
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
      OPENREG_CHECK(
          orMemcpy(device_storage->mutable_data(), host_data, host.nbytes(), orMemcpyKind::HostToDevice));
    }
  }
  if (device_impl->is_nested()) {
    return; // nested kernels write their operands' elements, never their metadata
  }
  if (device_impl->sizes() != alias_impl->sizes() || device_impl->strides() != alias_impl->strides() ||
      device_impl->storage_offset() != alias_impl->storage_offset()) {
    device_impl->set_sizes_and_strides(alias_impl->sizes(), alias_impl->strides(), alias_impl->storage_offset());
  }
}

at::Tensor HostCall::result(const at::Tensor& t) {
  std::optional<at::Tensor> out = converted(t);
  return out.has_value() ? *std::move(out) : t;
}

at::Tensor HostCall::result(at::Tensor&& t) {
  std::optional<at::Tensor> out = converted(t);
  return out.has_value() ? *std::move(out) : std::move(t);
}

std::optional<at::Tensor> HostCall::converted(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || !device_) {
    return std::nullopt;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      t.layout() == c10::Layout::Strided, op_name(), " produced a ", t.layout(),
      " tensor, but openreg supports only strided tensors: run this operator on CPU tensors.");
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  c10::StorageImpl* host = t.storage().unsafeGetStorageImpl();
  const Operand* operand = nullptr;
  const Operand* viewed = nullptr;
  for_each_operand([&](const Operand& o) {
    if (o.alias.unsafeGetTensorImpl() == impl) {
      operand = &o;
    } else if (viewed == nullptr && o.first_on_storage && o.alias.storage().unsafeGetStorageImpl() == host) {
      viewed = &o;
    }
  });
  if (operand != nullptr) {
    return *operand->device; // the operator returned an operand itself (in-place, out=)
  }
  if (t.is_nested()) {
    return converted_nested(t);
  }
  if (viewed != nullptr) {
    // A view of an operand: a view of the operand's device storage, with the
    // operand's dispatch keys (as the ImplType::VIEW constructor expects), or
    // a dense tensor's for a view of a nested operand's elements (unbind).
    std::optional<c10::DispatchKeySet> keys;
    if (!viewed->device->is_nested()) {
      keys = viewed->device->key_set();
    }
    return device_tensor_on(
        c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(viewed->device_storage)), t, keys);
  }
  for (const Fresh& f : fresh_) {
    if (f.host_storage_impl == host) {
      // Another result on the fresh memory of an earlier one.
      return device_tensor_on(
          c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(f.device_storage_impl)), t, std::nullopt);
    }
  }
  if (cpu_results_) {
    return std::nullopt; // fresh memory of a result bound for the CPU
  }
  // Fresh memory. If the kernel allocated it while begin() redirected CPU
  // allocations, it is already device memory; otherwise (another thread or
  // allocator) it is copied.
  std::optional<c10::DataPtr> device_memory = take_grown_device_memory(t.storage());
  if (device_memory.has_value() && t.use_count() == 1 && t.weak_use_count() == 1 && t.storage().use_count() == 1) {
    // Nothing else holds the kernel's result (the usual case): it becomes the
    // openreg tensor itself, its storage now owning the device memory.
    host->set_data_ptr_noswap(std::move(*device_memory));
    host->set_allocator(device_allocator());
    move_to_storage_device(*impl);
    impl->_change_backend_component_keys(*device_);
    // The result keeps its storage alive for the rest of the call.
    fresh_.push_back(Fresh{host, host, c10::Storage()});
    return std::nullopt;
  }
  return device_tensor_on(fresh_device_storage(host, std::move(device_memory)), t, std::nullopt);
}

// The device storage of a result's fresh host memory: the device memory its
// allocations grew into, if any, else a copy. It lives for the rest of the call.
c10::Storage HostCall::fresh_device_storage(c10::StorageImpl* host, std::optional<c10::DataPtr> device_memory) {
  c10::Storage storage;
  if (device_memory.has_value()) {
    storage = c10::Storage(
        c10::Storage::use_byte_size_t(), host->nbytes(), std::move(*device_memory), device_allocator(),
        /*resizable=*/true);
  } else {
    const c10::DeviceGuard guard(*device_);
    storage = c10::Storage(c10::Storage::use_byte_size_t(), host->nbytes(), device_allocator(), /*resizable=*/true);
    OPENREG_CHECK(orMemcpy(storage.mutable_data(), host->data(), host->nbytes(), orMemcpyKind::HostToDevice));
  }
  fresh_.push_back(Fresh{storage.unsafeGetStorageImpl(), host, storage});
  return storage;
}

namespace {

// A nested result's metadata tensor in CPU memory, as torch keeps it for
// nested tensors of every device: the kernel made it while its allocations
// came from the device (a CPU tensor over device memory otherwise).
at::Tensor host_metadata(const at::Tensor& m) {
  return m.defined() && is_host_visible(m.storage()) ? m.clone() : m;
}

} // namespace

// A nested CPU result of the kernel as a nested openreg tensor with the same
// nested sizes, strides and storage offsets: a view of an operand's device
// storage, another result's fresh memory, or its own memory made device memory
// (adopted when the kernel allocated it while begin() redirected allocations,
// copied otherwise). Its NestedTensorImpl is made anew, since a
// NestedTensorImpl's metadata cannot be replaced and its memory should not be
// device memory.
at::Tensor HostCall::converted_nested(const at::Tensor& t) {
  const at::native::NestedTensorImpl* nt = at::native::get_nested_tensor_impl(t);
  c10::StorageImpl* host = t.storage().unsafeGetStorageImpl();
  auto on = [&](const c10::Storage& storage) {
    return nested_tensor_on(
        storage, t, host_metadata(nt->get_nested_sizes()), host_metadata(nt->get_nested_strides()),
        host_metadata(nt->get_storage_offsets()));
  };
  const Operand* viewed = nullptr;
  for_each_operand([&](const Operand& o) {
    if (viewed == nullptr && o.first_on_storage && o.alias.storage().unsafeGetStorageImpl() == host) {
      viewed = &o;
    }
  });
  if (viewed != nullptr) {
    // A nested view of an operand (detach, a nested view of a dense buffer).
    return on(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(viewed->device_storage)));
  }
  for (const Fresh& f : fresh_) {
    if (f.host_storage_impl == host) {
      return on(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(f.device_storage_impl)));
    }
  }
  if (cpu_results_) {
    return t;
  }
  return on(fresh_device_storage(host, take_grown_device_memory(t.storage())));
}

std::vector<at::Tensor> HostCall::result(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    out.push_back(result(t));
  }
  return out;
}

} // namespace openreg
