// The per-device random number generator.
//
// An openreg generator owns a CPUGeneratorImpl and forwards seeding and state to
// it. CPU kernels run on device memory (the fallback, later native kernels) take
// that CPU generator, so every random op on openreg draws from the openreg
// device's generator and torch.openreg.manual_seed makes them reproducible.
//
// Most draws are made at the call, in the calling thread (DrawTarget,
// DeviceGeneric.cpp). A CPU kernel whose draws depend on device values
// (bernoulli(p_tensor), poisson...) is queued on a stream instead and draws
// when it runs (OpenRegBoxedCpuKernel.cpp): the generator remembers the last
// such draw, and the host waits for it before it reads, reseeds or draws from
// the state, and a draw queued on another stream waits for it on that stream,
// so the numbers are drawn in call order, as on CPU.
//
// The state (get_state/set_state, so torch.openreg.get_rng_state) is CUDA's
// Philox layout, 16 bytes: the seed (uint64) and the offset (int64), here the
// position in the Mersenne Twister stream of that seed (in pairs of 32-bit
// draws; OpenRegGenerator.cpp, offset_of_draws). That is
// what DTensor's OffsetBasedRNGTracker (torch/distributed/tensor/_random.py)
// reads and moves forward by a shard's numel to place each rank's draws. The
// one state that view cannot hold is a cached normal sample (CPU's
// normal_distribution, which normal_ of an odd number of values below 16 and
// log_normal_ use, keeps the second Box-Muller value for the next draw):
// then the state is the CPU generator's own (5056 bytes), which set_state
// accepts too (as does set_state of any CPU generator state: its position in a
// seed's stream is unknown, so the state stays in CPU's layout until reseeded).
#pragma once

#include <atomic>
#include <mutex>
#include <optional>

#include <ATen/core/Generator.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <c10/core/GeneratorImpl.h>

#include "runtime/OpenRegRuntime.h"

namespace openreg {

class OpenRegGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit OpenRegGeneratorImpl(c10::DeviceIndex device_index);
  ~OpenRegGeneratorImpl() override;

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  static c10::DeviceType device_type() {
    return c10::DeviceType::PrivateUse1;
  }

  // The CPU generator that CPU kernels running on this device must use: for
  // a draw in the calling thread, after the queued draws (cpu_generator_for).
  const at::Generator& cpu_generator() const {
    return cpu_;
  }

  // For a kernel about to be queued on `stream` that draws from
  // cpu_generator(): `stream` first waits for the draws queued on another
  // stream. Then draw_queued(stream) once it is.
  void order_queued_draw(orStream_t stream);
  void draw_queued(orStream_t stream);
  // Waits until the queued draws have run (the host may then use the state).
  void wait_for_queued_draws() const;

 private:
  OpenRegGeneratorImpl* clone_impl() const override;
  // How many draws the CPU generator made since it was seeded, or nullopt
  // when the (seed, offset) view cannot describe its state. Holds cpu_'s mutex.
  std::optional<uint64_t> stream_position() const;
  // Seeds the CPU generator and moves it `draws` draws on. Holds cpu_'s mutex.
  void seek(uint64_t seed, uint64_t draws);

  mutable at::Generator cpu_; // mutable: locking its mutex is not a state change
  // A point of the CPU generator's stream: `engine` is the state `draws`
  // draws after seeding with engine.seed(). The generator's state was there
  // (or is a number of draws after it: draws are all that change it between
  // seeds), so stream_position() counts from it, and moves it to where it
  // counted to. nullopt after a CPU-layout set_state, until reseeded.
  struct StreamMark {
    at::mt19937 engine;
    uint64_t draws;
  };
  mutable std::optional<StreamMark> mark_;
  // The last queued draw: an event recorded after it on queued_stream_,
  // pending until the host has seen it complete.
  mutable std::mutex queued_mutex_;
  mutable std::atomic<bool> pending_{false};
  orEvent_t queued_ = nullptr;
  orStream_t queued_stream_ = nullptr;
};

const at::Generator& default_generator(c10::DeviceIndex device_index);

// The openreg generator a draw for openreg tensors of `device_index` uses:
// `generator`, or with none given the device's default one. A generator of
// another device raises, as CUDA's check_generator does; `op` names the
// operator in that message. The reference lives as long as `generator` (or
// the process, for the default).
OpenRegGeneratorImpl& openreg_generator_for(
    const std::optional<at::Generator>& generator,
    c10::DeviceIndex device_index,
    const char* op);

// The CPU generator of openreg_generator_for, for a draw in the calling
// thread: after the draws queued from it have run.
const at::Generator& cpu_generator_for(
    const std::optional<at::Generator>& generator,
    c10::DeviceIndex device_index,
    const char* op);
at::Generator new_generator(c10::DeviceIndex device_index);

} // namespace openreg
