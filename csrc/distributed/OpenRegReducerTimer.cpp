// DDP's timer for openreg, so DistributedDataParallel measures forward,
// backward and communication times on openreg as it does on CUDA (its
// ddp_logging_data) instead of warning "Time stats are currently only
// collected for CPU and CUDA devices". The reducer records an event on the
// device's current stream at each point of an iteration and asks for the
// time between two of them at the next iteration's start, when the work is
// done: device time, as CUDA's timer measures with cudaEvents.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <c10/core/DeviceGuard.h>

#include <array>
#include <optional>

#include "device/OpenRegException.h"
#include "device/OpenRegStream.h"
#include "runtime/OpenRegRuntime.h"

namespace openreg {
namespace {

class OpenRegTimer final : public c10d::Timer {
 public:
  explicit OpenRegTimer(c10::Device device) : device_(device) {}
  OpenRegTimer(const OpenRegTimer&) = delete;
  OpenRegTimer& operator=(const OpenRegTimer&) = delete;

  ~OpenRegTimer() override {
    for (orEvent_t event : events_) {
      if (event != nullptr) {
        orEventDestroy(event);
      }
    }
  }

  void record(Event event) override {
    Timer::record(event); // the host's time, which the reducer reads too
    const c10::DeviceGuard guard(device_);
    orEvent_t& slot = events_[static_cast<size_t>(event)];
    if (slot == nullptr) {
      OPENREG_CHECK(orEventCreateWithFlags(&slot, orEventDefault));
    }
    OPENREG_CHECK(orEventRecord(slot, current_raw_stream(device_.index())));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    orEvent_t from = events_[static_cast<size_t>(start)];
    orEvent_t to = events_[static_cast<size_t>(end)];
    // Never recorded (no backward, or no_sync): nothing to measure.
    if (from == nullptr || to == nullptr) {
      return std::nullopt;
    }
    const c10::DeviceGuard guard(device_);
    OPENREG_CHECK(orEventSynchronize(from));
    OPENREG_CHECK(orEventSynchronize(to));
    float ms = 0;
    OPENREG_CHECK(orEventElapsedTime(&ms, from, to));
    // An end recorded before its start (this iteration's end not yet recorded).
    if (ms < 0) {
      return std::nullopt;
    }
    return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }

 private:
  c10::Device device_;
  std::array<orEvent_t, 5> events_{}; // one per c10d::Timer::Event
};

} // namespace
} // namespace openreg

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, openreg::OpenRegTimer)
} // namespace c10d
