#include "OpenRegGenerator.h"

#include <vector>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>

#include "OpenRegDevice.h"
#include "OpenRegException.h"

namespace openreg {

OpenRegGeneratorImpl::OpenRegGeneratorImpl(c10::DeviceIndex device_index)
    : c10::GeneratorImpl(
          c10::Device(c10::DeviceType::PrivateUse1, device_index),
          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

OpenRegGeneratorImpl::~OpenRegGeneratorImpl() {
  if (queued_ != nullptr) {
    orEventDestroy(queued_); // a queued draw holds cpu_, not this
  }
}

void OpenRegGeneratorImpl::order_queued_draw(orStream_t stream) {
  if (!pending_.load(std::memory_order_acquire)) {
    return;
  }
  std::lock_guard<std::mutex> lock(queued_mutex_);
  if (pending_.load(std::memory_order_relaxed) && queued_stream_ != stream) {
    OPENREG_CHECK(orStreamWaitEvent(stream, queued_));
  }
}

void OpenRegGeneratorImpl::draw_queued(orStream_t stream) {
  std::lock_guard<std::mutex> lock(queued_mutex_);
  if (queued_ == nullptr) {
    OPENREG_CHECK(orEventCreateWithFlags(&queued_, orEventDisableTiming));
  }
  OPENREG_CHECK(orEventRecord(queued_, stream));
  queued_stream_ = stream;
  pending_.store(true, std::memory_order_release);
}

void OpenRegGeneratorImpl::wait_for_queued_draws() const {
  if (!pending_.load(std::memory_order_acquire)) {
    return;
  }
  std::lock_guard<std::mutex> lock(queued_mutex_);
  if (pending_.load(std::memory_order_relaxed)) {
    // A failed kernel's error raises here, as at any synchronization.
    OPENREG_CHECK(orEventSynchronize(queued_));
    pending_.store(false, std::memory_order_relaxed);
  }
}

// The CPU generator's own mutex guards its state against CPU kernels drawing
// from it concurrently; Python holds this generator's mutex_, not that one.
// Whatever reads or changes the state first waits for the queued draws.
void OpenRegGeneratorImpl::set_current_seed(uint64_t seed) {
  wait_for_queued_draws();
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.set_current_seed(seed);
}

// The state is a CPU (Mersenne Twister) generator's, which has no Philox
// offset. torch.Generator.__reduce__ (copy, deepcopy, pickle) reads and
// writes the offset of every non-CPU generator, so report 0 and accept 0.
void OpenRegGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(
      offset == 0, "openreg generators have no offset (their state is a CPU generator's); got offset ", offset);
}

uint64_t OpenRegGeneratorImpl::get_offset() const {
  return 0;
}

uint64_t OpenRegGeneratorImpl::current_seed() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.current_seed();
}

uint64_t OpenRegGeneratorImpl::seed() {
  wait_for_queued_draws();
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.seed();
}

void OpenRegGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  wait_for_queued_draws();
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> OpenRegGeneratorImpl::get_state() const {
  wait_for_queued_draws();
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.unsafeGetGeneratorImpl()->get_state();
}

OpenRegGeneratorImpl* OpenRegGeneratorImpl::clone_impl() const {
  wait_for_queued_draws();
  auto* copy = new OpenRegGeneratorImpl(device().index());
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  copy->cpu_ = cpu_.clone();
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex device_index) {
  // A function-local static rather than std::call_once, which sets two
  // thread-locals (calls into the dynamic linker here) on every call.
  static const std::vector<at::Generator> generators = [] {
    std::vector<at::Generator> made;
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      made.emplace_back(at::make_generator<OpenRegGeneratorImpl>(i));
    }
    return made;
  }();
  const c10::DeviceIndex index = device_index == -1 ? peek_current_device() : device_index;
  if (index < 0 || static_cast<size_t>(index) >= generators.size()) {
    validate_device_index(index); // raises, naming the valid range
  }
  return generators.at(static_cast<size_t>(index));
}

at::Generator new_generator(c10::DeviceIndex device_index) {
  const c10::DeviceIndex index = device_index == -1 ? peek_current_device() : device_index;
  validate_device_index(index);
  return at::make_generator<OpenRegGeneratorImpl>(index);
}

OpenRegGeneratorImpl& openreg_generator_for(
    const std::optional<at::Generator>& generator,
    c10::DeviceIndex device_index,
    const char* op) {
  if (!generator.has_value() || !generator->defined()) {
    return *default_generator(device_index).get<OpenRegGeneratorImpl>();
  }
  TORCH_CHECK(
      generator->device().is_privateuseone(), "Expected a 'openreg' device type for generator but found '",
      generator->device().type(), "' (", op, "): pass torch.Generator(device=\"openreg\"), or no generator.");
  return *generator->get<OpenRegGeneratorImpl>();
}

const at::Generator& cpu_generator_for(
    const std::optional<at::Generator>& generator,
    c10::DeviceIndex device_index,
    const char* op) {
  OpenRegGeneratorImpl& openreg = openreg_generator_for(generator, device_index, op);
  openreg.wait_for_queued_draws();
  return openreg.cpu_generator();
}

} // namespace openreg
