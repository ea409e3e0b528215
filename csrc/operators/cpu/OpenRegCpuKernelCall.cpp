#include "operators/cpu/OpenRegCpuKernelCall.h"

#include <algorithm>
#include <cstring>

#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorImpl.h>

#include "memory/OpenRegAllocator.h"
#include "operators/cpu/OpenRegCpuAlias.h"
#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"
#include "device/OpenRegGenerator.h"
#include "device/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {
namespace {

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

// A list for CpuKernelCall::alias(list), reused by the next call on the thread when
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

// For set_sync_debug_mode: whether operator `name` ("ns::op" or
// "ns::op.overload") makes the host wait for the device's values, as the
// same operator does on CUDA (nonzero, masked_select, unique...).
bool waits_for_values(const std::string& name) {
  const size_t separator = name.find("::");
  const size_t dot = name.find('.', separator == std::string::npos ? 0 : separator);
  const c10::OperatorName op(
      name.substr(0, dot), dot == std::string::npos ? std::string() : name.substr(dot + 1));
  const std::optional<c10::OperatorHandle> handle = c10::Dispatcher::singleton().findOp(op);
  return handle.has_value() &&
      (handle->hasTag(at::Tag::dynamic_output_shape) || handle->hasTag(at::Tag::data_dependent_output));
}

} // namespace

CpuKernelCall::CpuKernelCall(const char* op, bool accepts_cpu_tensors)
    : op_(op),
      accepts_cpu_tensors_(accepts_cpu_tensors),
      borrows_operands_(true),
      operands_(discrete_memory()) {}

CpuKernelCall::CpuKernelCall(const c10::OperatorName& op, bool accepts_cpu_tensors)
    : op_name_(&op),
      accepts_cpu_tensors_(accepts_cpu_tensors),
      borrows_operands_(false),
      operands_(discrete_memory()) {}

std::string CpuKernelCall::op_name() const {
  return op_name_ != nullptr ? c10::toString(*op_name_) : std::string(op_);
}

CpuKernelCall::~CpuKernelCall() {
  if (marked_) {
    orMarkKernel(-1);
  }
  if (redirecting_) {
    redirect_cpu_allocations(previous_redirect_);
  }
  written_.clear(); // (finish() did, unless the kernel threw)
  // Sparse aliases hold aliases of their members: drop them first, so that
  // the member aliases nothing kept return to the pool.
  sparse_operands_.clear();
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
  // The CPU kernel's tensors are gone: alias objects nothing kept are reused
  // by the next call on this thread.
  operands_.end();
}

void CpuKernelCall::note_device(c10::Device device, const char* argument) {
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

void CpuKernelCall::note(const at::Tensor& t, const char* argument, bool written) {
  if (!t.defined()) {
    return;
  }
  if (t.device().is_privateuseone()) {
    note_device(t.device(), argument);
    if (!t.is_nested() && t.layout() == c10::kStrided) {
      work_ = std::max(work_, t.numel());
    }
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

void CpuKernelCall::note(const std::optional<at::Tensor>& t, const char* argument) {
  if (t.has_value()) {
    note(*t, argument);
  }
}

void CpuKernelCall::note(at::ITensorListRef tensors, const char* argument) {
  for (const at::Tensor& t : tensors) {
    note(t, argument);
  }
}

void CpuKernelCall::note(const c10::List<std::optional<at::Tensor>>& tensors, const char* argument) {
  for_each_tensor(tensors, [&](const at::Tensor* t) {
    if (t != nullptr) {
      note(*t, argument);
    }
  });
}

void CpuKernelCall::note(const std::optional<at::Device>& device, const char* argument) {
  if (device.has_value() && device->is_privateuseone()) {
    note_device(device->has_index() ? *device : c10::Device(device->type(), current_device()), argument);
  } else if (device.has_value() && device->is_cpu()) {
    cpu_results_ = true;
  }
}

void CpuKernelCall::note(const std::optional<at::Generator>& generator, const char* /*argument*/) {
  if (generator.has_value() && generator->defined()) {
    (generator->device().is_privateuseone() ? openreg_generator_ : other_generator_) = true;
  }
}

bool CpuKernelCall::may_queue() const {
  if (!device_ || cpu_results_ || inside_kernel() || operands_.staged()) {
    return false;
  }
  if (launch_blocking()) {
    return current_stream_capturing(device_->index()); // recorded, not run
  }
  return !small_kernel_on_idle_stream(device_->index(), work_);
}

void CpuKernelCall::begin() {
  check();
  if (!device_) {
    return; // CPU tensors only (a fallback reached through a CPU generator or storage)
  }
  if (peek_current_device() != device_->index()) {
    guard_.emplace(*device_);
  }
  if (C10_UNLIKELY(sync_debug_mode() != 0)) {
    const std::string name = op_name();
    if (waits_for_values(name)) {
      check_sync_debug(name.c_str());
    }
  }
  if (wait_) {
    join_current_stream(device_->index());
  }
  orMarkKernel(device_->index()); // the CPU kernel runs here now, for utilization sampling
  marked_ = true;
  if (cpu_results_ || operands_.staged()) {
    // The results belong to the CPU, or are copied to the device
    // (converted()): its allocator stays as it is.
    return;
  }
  previous_redirect_ = redirect_cpu_allocations(device_->index());
  redirecting_ = true;
}

void CpuKernelCall::check() const {
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
}

const at::Tensor& CpuKernelCall::alias(const at::Tensor& t) {
  return alias(t, borrows_operands_);
}

const at::Tensor& CpuKernelCall::alias(const at::Tensor& t, bool borrow) {
  if (!t.defined() || !t.device().is_privateuseone()) {
    return t;
  }
  if (C10_UNLIKELY(is_sparse_layout(t))) {
    return sparse_alias(t, borrow);
  }
  auto [operand, added] = operands_.get(t);
  if (added) {
    operand->extra = keep(t, borrow);
  }
  return operand->alias;
}

at::Tensor CpuKernelCall::written(const at::Tensor& t) {
  at::Tensor cpu = alias(t);
  const bool known = std::any_of(written_.begin(), written_.end(), [&](const Written& w) {
    return w.device_tensor->unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
  });
  if (t.defined() && t.device().is_privateuseone() && !known) {
    written_.push_back(Written{keep(t, borrows_operands_), cpu});
  }
  return cpu;
}

std::optional<at::Tensor> CpuKernelCall::alias(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) {
    return std::nullopt;
  }
  return alias(*t);
}

CpuAliasList CpuKernelCall::alias(at::ITensorListRef tensors) {
  CpuAliasList out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    out.push_back(alias(t));
  }
  return out;
}

const c10::List<std::optional<at::Tensor>>& CpuKernelCall::alias(const c10::List<std::optional<at::Tensor>>& tensors) {
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
    out.push_back(t != nullptr ? std::optional<at::Tensor>(alias(*t)) : std::nullopt);
  });
  return out;
}

c10::Storage CpuKernelCall::alias(const c10::Storage& storage) {
  if (!storage.device().is_privateuseone()) {
    return storage;
  }
  return operands_.staged() ? host_copy(storage) : cpu_alias_storage(storage);
}

std::optional<at::Device> CpuKernelCall::device(const std::optional<at::Device>& device) const {
  if (device.has_value() && device->is_privateuseone()) {
    return c10::Device(c10::DeviceType::CPU);
  }
  return device;
}

std::optional<at::Generator> CpuKernelCall::generator(const std::optional<at::Generator>& generator) const {
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

void CpuKernelCall::finish() {
  if (marked_) {
    orMarkKernel(-1);
    marked_ = false;
  }
  if (redirecting_) {
    redirect_cpu_allocations(previous_redirect_);
    redirecting_ = false;
  }
  guard_.reset();
  for (const Written& w : written_) {
    write_back(w);
  }
  written_.clear();
  if (operands_.staged()) {
    // Every operand goes back, not only those the schema marks as written:
    // native_batch_norm updates its running statistics, which its schema
    // does not mark.
    operands_.for_each([&](const Operand& o) {
      if (o.first_on_storage) {
        copy_back(o.device_storage, o.alias.storage());
      }
    });
  }
}

// A written operand whose CPU alias the CPU kernel resized or restrided: give
// the device tensor the same storage size, bytes and geometry.
void CpuKernelCall::write_back(const Written& w) {
  if (C10_UNLIKELY(is_sparse_layout(*w.device_tensor))) {
    write_back_sparse(w);
    return;
  }
  c10::TensorImpl* device_impl = w.device_tensor->unsafeGetTensorImpl();
  c10::TensorImpl* alias_impl = w.alias.unsafeGetTensorImpl();
  const c10::Storage& cpu = alias_impl->storage();
  c10::StorageImpl* device_storage = device_impl->storage().unsafeGetStorageImpl();
  const void* cpu_data = cpu.unsafeGetStorageImpl()->data_ptr().get();
  if (cpu_data != orKernelAddress(device_storage->data_ptr().get())) {
    // The CPU kernel resized the alias (out= of another size). Its new bytes
    // are device memory: the device storage adopts them, no copy.
    std::optional<c10::DataPtr> grown;
    if (device_storage->resizable()) {
      grown = take_grown_device_memory(cpu);
    }
    if (grown.has_value()) {
      device_storage->set_data_ptr_noswap(std::move(*grown));
      device_storage->set_nbytes(cpu.nbytes());
    } else {
      copy_back(device_storage, cpu);
    }
  }
  if (device_impl->is_nested()) {
    return; // nested kernels write their operands' elements, never their metadata
  }
  if (device_impl->sizes() != alias_impl->sizes() || device_impl->strides() != alias_impl->strides() ||
      device_impl->storage_offset() != alias_impl->storage_offset()) {
    device_impl->set_sizes_and_strides(alias_impl->sizes(), alias_impl->strides(), alias_impl->storage_offset());
  }
  // A kernel may flip an out='s conj bit (linalg_lu_solve with left=False).
  device_impl->_set_conj(alias_impl->is_conj());
  device_impl->_set_neg(alias_impl->is_neg());
}

void CpuKernelCall::copy_back(c10::StorageImpl* device_storage, const c10::Storage& host) {
  if (std::find(copied_back_.begin(), copied_back_.end(), device_storage) != copied_back_.end()) {
    return;
  }
  copied_back_.push_back(device_storage);
  if (host.nbytes() > device_storage->nbytes()) {
    resize_storage_bytes(device_storage, host.nbytes());
  }
  if (host.nbytes() > 0) {
    OPENREG_CHECK(orMemcpy(device_storage->mutable_data(), host.data(), host.nbytes(), orMemcpyKind::HostToDevice));
  }
}

at::Tensor CpuKernelCall::result(const at::Tensor& t) {
  std::optional<at::Tensor> out = converted(t);
  return out.has_value() ? *std::move(out) : t;
}

at::Tensor CpuKernelCall::result(at::Tensor&& t) {
  std::optional<at::Tensor> out = converted(t);
  return out.has_value() ? *std::move(out) : std::move(t);
}

std::optional<at::Tensor> CpuKernelCall::converted(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || !device_) {
    return std::nullopt;
  }
  if (C10_UNLIKELY(is_sparse_layout(t))) {
    return converted_sparse(t);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      t.layout() == c10::Layout::Strided, op_name(), " produced a ", t.layout(),
      " tensor, but openreg supports only strided tensors: run this operator on CPU tensors.");
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  c10::StorageImpl* cpu = t.storage().unsafeGetStorageImpl();
  const Operand* operand = nullptr;
  const Operand* viewed = nullptr;
  operands_.for_each([&](const Operand& o) {
    if (o.alias.unsafeGetTensorImpl() == impl) {
      operand = &o;
    } else if (viewed == nullptr && o.first_on_storage && o.alias.storage().unsafeGetStorageImpl() == cpu) {
      viewed = &o;
    }
  });
  if (operand != nullptr) {
    if (operands_.staged()) {
      // It wrote the host copy (a sparse operand's member the kernel updated).
      copy_back(operand->device_storage, operand->alias.storage());
    }
    return *operand->extra; // the operator returned an operand itself (in-place, out=)
  }
  if (t.is_nested()) {
    return converted_nested(t);
  }
  if (viewed != nullptr) {
    // A view of an operand: a view of the operand's device storage, with the
    // operand's dispatch keys (as the ImplType::VIEW constructor expects), or
    // its buffer's for a view of a nested operand's elements (unbind), as
    // NestedTensorImpl::get_buffer() gives them. A view is an inference
    // tensor only if its base is, also under torch.inference_mode().
    const at::Tensor& base = *viewed->extra;
    const c10::DispatchKeySet keys = base.is_nested()
        ? at::native::get_nested_tensor_impl(base)->get_unsafe_storage_as_tensor().key_set()
        : base.key_set();
    return device_tensor_on(
        c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(viewed->device_storage)), t, keys);
  }
  for (const Fresh& f : fresh_) {
    if (f.cpu_storage_impl == cpu) {
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
    cpu->set_data_ptr_noswap(std::move(*device_memory));
    cpu->set_allocator(device_allocator());
    move_to_storage_device(*impl);
    impl->_change_backend_component_keys(*device_);
    // The result keeps its storage alive for the rest of the call.
    fresh_.push_back(Fresh{cpu, cpu, c10::Storage()});
    return std::nullopt;
  }
  return device_tensor_on(fresh_device_storage(cpu, std::move(device_memory)), t, std::nullopt);
}

// The device storage of a result's fresh CPU memory: the device memory its
// allocations grew into, if any, else a copy. It lives for the rest of the call.
c10::Storage CpuKernelCall::fresh_device_storage(c10::StorageImpl* cpu, std::optional<c10::DataPtr> device_memory) {
  c10::Storage storage;
  if (device_memory.has_value()) {
    storage = c10::Storage(
        c10::Storage::use_byte_size_t(), cpu->nbytes(), std::move(*device_memory), device_allocator(),
        /*resizable=*/true);
  } else {
    const c10::DeviceGuard guard(*device_);
    storage = c10::Storage(c10::Storage::use_byte_size_t(), cpu->nbytes(), device_allocator(), /*resizable=*/true);
    OPENREG_CHECK(orMemcpy(storage.mutable_data(), cpu->data(), cpu->nbytes(), orMemcpyKind::HostToDevice));
  }
  fresh_.push_back(Fresh{storage.unsafeGetStorageImpl(), cpu, storage});
  return storage;
}

namespace {

// A nested result's metadata tensor in CPU memory, as torch keeps it for
// nested tensors of every device: the kernel made it while its allocations
// came from the device (a CPU tensor over device memory otherwise).
at::Tensor cpu_metadata(const at::Tensor& m) {
  return m.defined() && is_cpu_visible(m.storage()) ? m.clone() : m;
}

} // namespace

// A nested CPU result of the kernel as a nested openreg tensor with the same
// nested sizes, strides and storage offsets: a view of an operand's device
// storage, another result's fresh memory, or its own memory made device memory
// (adopted when the kernel allocated it while begin() redirected allocations,
// copied otherwise). Its NestedTensorImpl is made anew, since a
// NestedTensorImpl's metadata cannot be replaced and its memory should not be
// device memory.
at::Tensor CpuKernelCall::converted_nested(const at::Tensor& t) {
  const at::native::NestedTensorImpl* nt = at::native::get_nested_tensor_impl(t);
  c10::StorageImpl* cpu = t.storage().unsafeGetStorageImpl();
  auto on = [&](const c10::Storage& storage) {
    return nested_tensor_on(
        storage, t, cpu_metadata(nt->get_nested_sizes()), cpu_metadata(nt->get_nested_strides()),
        cpu_metadata(nt->get_storage_offsets()));
  };
  const Operand* viewed = nullptr;
  operands_.for_each([&](const Operand& o) {
    if (viewed == nullptr && o.first_on_storage && o.alias.storage().unsafeGetStorageImpl() == cpu) {
      viewed = &o;
    }
  });
  if (viewed != nullptr) {
    // A nested view of an operand (transpose, detach, a nested view of a dense
    // buffer), made by NestedTensorImpl's view constructor from the operand,
    // as torch's nested view kernels make theirs.
    return at::detail::make_tensor<at::native::NestedTensorImpl>(
        c10::TensorImpl::VIEW, *viewed->extra, cpu_metadata(nt->get_nested_sizes()),
        cpu_metadata(nt->get_nested_strides()), cpu_metadata(nt->get_storage_offsets()));
  }
  for (const Fresh& f : fresh_) {
    if (f.cpu_storage_impl == cpu) {
      return on(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(f.device_storage_impl)));
    }
  }
  if (cpu_results_) {
    return t;
  }
  return on(fresh_device_storage(cpu, take_grown_device_memory(t.storage())));
}

// A sparse operand's CPU alias: a sparse CPU tensor of its layout over CPU
// aliases of its members (owned: a written operand's members are replaced
// while the call runs), one per operand.
const at::Tensor& CpuKernelCall::sparse_alias(const at::Tensor& t, bool borrow) {
  for (const SparseOperand& o : sparse_operands_) {
    if (o.device_tensor->unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      return o.alias;
    }
  }
  c10::SmallVector<at::Tensor, 3> members = sparse_members(t);
  for (at::Tensor& m : members) {
    m = alias(m, /*borrow=*/false);
  }
  return sparse_operands_.emplace_back(SparseOperand{keep(t, borrow), sparse_tensor_on(c10::kCPU, t, members)})
      .alias;
}

// A sparse CPU result as a sparse openreg tensor: an operand itself (in-place,
// coalesce of a coalesced tensor), or a new sparse tensor over its members,
// each converted as a dense result is (an operand's member, a view of one,
// or fresh device memory).
at::Tensor CpuKernelCall::converted_sparse(const at::Tensor& t) {
  for (const SparseOperand& o : sparse_operands_) {
    if (o.alias.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      return *o.device_tensor;
    }
  }
  if (cpu_results_) {
    return t;
  }
  c10::SmallVector<at::Tensor, 3> members = sparse_members(t);
  for (at::Tensor& m : members) {
    m = result(m);
  }
  return sparse_tensor_on(*device_, t, members);
}

// A written sparse operand (add_, mul_, zero_, copy_, resize_as_ on sparse
// tensors): the CPU kernel may have given its alias new members and sizes,
// which the openreg tensor takes, converted. It may also have resized a member
// in place (`out._values().resize_(...)`), then perhaps narrowed it
// (set_nnz_and_narrow): first every operand takes its alias's new bytes and
// geometry, as a written operand does.
void CpuKernelCall::write_back_sparse(const Written& w) {
  operands_.for_each([&](const Operand& o) {
    write_back(Written{c10::MaybeOwned<at::Tensor>::borrowed(*o.extra), o.alias});
  });
  c10::SmallVector<at::Tensor, 3> members = sparse_members(w.alias);
  for (at::Tensor& m : members) {
    m = result(m);
  }
  set_sparse_members(*w.device_tensor, w.alias, members);
}

std::vector<at::Tensor> CpuKernelCall::result(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    out.push_back(result(t));
  }
  return out;
}

} // namespace openreg
