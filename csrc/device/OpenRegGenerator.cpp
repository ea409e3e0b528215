#include "device/OpenRegGenerator.h"

#include <cstring>
#include <mutex>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>

#include "device/OpenRegDevice.h"
#include "device/OpenRegException.h"

namespace openreg {
namespace {

// CUDA's state layout (CUDAGeneratorImpl::get_state): seed, then offset.
constexpr size_t kSeedSize = sizeof(uint64_t);
constexpr size_t kSeedOffsetStateSize = kSeedSize + sizeof(int64_t);

// The state's offset counts pairs of 32-bit draws. DTensor's tracker moves it
// by element counts (a shard's numel, rounded up to a multiple of 4), and each
// of CPU's elementwise distributions takes at most two draws per element
// (uniform_ of float64, bernoulli_ and so dropout, exponential_, and the
// Box-Muller pairs of normal_ take two; uniform_ and normal_ of float32 one),
// so counted in pairs the shards of one tensor never draw the same numbers.
// A position after an odd number of draws keeps that last draw in bit 62,
// which the tracker's additions leave alone.
constexpr int64_t kOddDrawBit = int64_t{1} << 62;

int64_t offset_of_draws(uint64_t draws) {
  TORCH_CHECK(draws / 2 < static_cast<uint64_t>(kOddDrawBit), "openreg generator: ", draws,
              " draws since seeding do not fit its state's offset");
  return static_cast<int64_t>(draws / 2) | (draws % 2 == 1 ? kOddDrawBit : 0);
}

uint64_t draws_of_offset(int64_t offset) {
  TORCH_CHECK(offset >= 0, "openreg generator state: the offset must not be negative, got ", offset);
  return 2 * static_cast<uint64_t>(offset & ~kOddDrawBit) + ((offset & kOddDrawBit) != 0 ? 1 : 0);
}

at::CPUGeneratorImpl& cpu_impl(const at::Generator& cpu) {
  return *cpu.get<at::CPUGeneratorImpl>();
}

// Moves `engine` `count` draws on, as `count` calls of engine() would, but a
// block of 624 at a time: at::mt19937 twists its whole state when a draw finds
// `left_` run down to 0, and otherwise only moves `next_`.
void skip_draws(at::mt19937& engine, uint64_t count) {
  while (count > 0) {
    at::mt19937_data_pod data = engine.data();
    const uint64_t before_twist = static_cast<uint64_t>(data.left_) - 1;
    if (count <= before_twist) {
      data.left_ -= static_cast<int>(count);
      data.next_ += static_cast<uint32_t>(count);
      engine.set_data(data);
      return;
    }
    data.next_ += static_cast<uint32_t>(before_twist);
    data.left_ = 1;
    engine.set_data(data);
    engine(); // twists, and draws the new block's first number
    count -= before_twist + 1;
  }
}

// The most draws a state moves by at once (set_rng_state's offset, the walk
// of draws_between): skipping costs about 3 ns per draw, so 2^36 draws about
// 3 minutes. Beyond it, the state would seem to hang.
constexpr uint64_t kMaxSkip = uint64_t{1} << 36;

// How many draws lead from `from` to `to`, or nullopt if `to` is not ahead of
// it in the same stream (within kMaxSkip). Walks a block at a time, comparing
// the twisted state.
std::optional<uint64_t> draws_between(at::mt19937 from, const at::mt19937& to) {
  const at::mt19937_data_pod target = to.data();
  if (from.seed() != target.seed_) {
    return std::nullopt;
  }
  for (uint64_t count = 0; count <= kMaxSkip;) {
    const at::mt19937_data_pod data = from.data();
    if (data.state_ == target.state_) {
      const bool ahead = target.left_ <= data.left_ &&
          target.next_ - data.next_ == static_cast<uint32_t>(data.left_ - target.left_);
      return ahead ? std::optional<uint64_t>(count + static_cast<uint64_t>(data.left_ - target.left_))
                   : std::nullopt;
    }
    skip_draws(from, static_cast<uint64_t>(data.left_));
    count += static_cast<uint64_t>(data.left_);
  }
  return std::nullopt;
}

} // namespace

OpenRegGeneratorImpl::OpenRegGeneratorImpl(c10::DeviceIndex device_index)
    : c10::GeneratorImpl(
          c10::Device(c10::DeviceType::PrivateUse1, device_index),
          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)),
      mark_(StreamMark{cpu_impl(cpu_).engine(), 0}) {}

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
  mark_ = StreamMark{cpu_impl(cpu_).engine(), 0};
}

// The offset of Generator.get_offset/set_offset is left out of the state's
// (seed, offset) view: torch.Generator.__reduce__ (copy, deepcopy, pickle)
// reads and writes it for every non-CPU generator, also when the state is in
// CPU's layout and has no offset, so report 0 and accept 0.
void OpenRegGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(
      offset == 0, "openreg generators take no offset through set_offset (got ", offset,
      "): their offset is part of the state, so set the (seed, offset) of get_state() with set_state()");
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
  const uint64_t seed = cpu_.seed();
  mark_ = StreamMark{cpu_impl(cpu_).engine(), 0};
  return seed;
}

std::optional<uint64_t> OpenRegGeneratorImpl::stream_position() const {
  at::CPUGeneratorImpl& cpu = cpu_impl(cpu_);
  if (!mark_.has_value() || cpu.next_float_normal_sample().has_value() ||
      cpu.next_double_normal_sample().has_value()) {
    return std::nullopt;
  }
  at::mt19937 now = cpu.engine();
  const std::optional<uint64_t> drawn = draws_between(mark_->engine, now);
  TORCH_INTERNAL_ASSERT(
      drawn.has_value(), "openreg generator: its CPU generator is not ahead of its last known position in its seed's "
      "stream (or more than 2^36 draws ahead), so its (seed, offset) state cannot be told");
  mark_ = StreamMark{now, mark_->draws + *drawn};
  return mark_->draws;
}

void OpenRegGeneratorImpl::seek(uint64_t seed, uint64_t draws) {
  // DTensor's tracker moves forward a shard at a time: start from the mark
  // when it is on the way rather than from the seed.
  const bool from_mark = mark_.has_value() && mark_->engine.seed() == seed && mark_->draws <= draws;
  const uint64_t from = from_mark ? mark_->draws : 0;
  TORCH_CHECK_VALUE(
      draws - from <= kMaxSkip, "openreg generator state: offset ", offset_of_draws(draws), " is too far (",
      draws, " draws); openreg's generator, CPU's Mersenne Twister, reaches a position draw by draw and goes at most "
      "2^36 draws (2^35 offset units) at once. Use a smaller offset, or another seed.");
  at::CPUGeneratorImpl& cpu = cpu_impl(cpu_);
  cpu.set_current_seed(seed); // also forgets the cached normal samples
  at::mt19937 engine = from_mark ? mark_->engine : cpu.engine();
  skip_draws(engine, draws - from);
  cpu.set_engine(engine);
  mark_ = StreamMark{engine, draws};
}

void OpenRegGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  wait_for_queued_draws();
  at::detail::check_rng_state(new_state);
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  if (static_cast<size_t>(new_state.numel()) == kSeedOffsetStateSize) {
    const auto* bytes = static_cast<const uint8_t*>(new_state.data());
    uint64_t seed = 0;
    int64_t offset = 0;
    std::memcpy(&seed, bytes, kSeedSize);
    std::memcpy(&offset, bytes + kSeedSize, sizeof(offset));
    seek(seed, draws_of_offset(offset));
    return;
  }
  // A CPU generator's state (it checks the size, naming the ones it takes).
  cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
  mark_.reset();
}

c10::intrusive_ptr<c10::TensorImpl> OpenRegGeneratorImpl::get_state() const {
  wait_for_queued_draws();
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  const std::optional<uint64_t> draws = stream_position();
  if (!draws.has_value()) {
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }
  auto state = at::detail::empty_cpu({static_cast<int64_t>(kSeedOffsetStateSize)}, c10::ScalarType::Byte);
  const uint64_t seed = cpu_impl(cpu_).current_seed();
  const int64_t offset = offset_of_draws(*draws);
  std::memcpy(state.data_ptr<uint8_t>(), &seed, kSeedSize);
  std::memcpy(state.data_ptr<uint8_t>() + kSeedSize, &offset, sizeof(offset));
  return state.getIntrusivePtr();
}

OpenRegGeneratorImpl* OpenRegGeneratorImpl::clone_impl() const {
  wait_for_queued_draws();
  auto* copy = new OpenRegGeneratorImpl(device().index());
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  copy->cpu_ = cpu_.clone();
  copy->mark_ = mark_;
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
