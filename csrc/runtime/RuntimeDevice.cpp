// Device enumeration, configuration and the current device of each thread.
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "OpenRegRuntimeInternal.h"

namespace openreg {
namespace {

struct InitState {
  std::once_flag once;
  orError status = orError::Success;
  std::string message;
  detail::Config config;
};

InitState& state() {
  static auto* s = new InitState(); // leaked: worker threads may outlive static dtors
  return *s;
}

thread_local int current_device = 0;

// The configuration once orInit succeeded (null until then): every kernel
// address translation reads it, so it is one load rather than a call to
// state().
std::atomic<const detail::Config*> ready_config{nullptr};

orError bad_config(InitState& s, std::string message) {
  s.message = std::move(message);
  return orError::InvalidConfiguration;
}

orError read_device_count(InitState& s) {
  const char* env = std::getenv("OPENREG_DEVICE_COUNT");
  if (env == nullptr || *env == '\0') {
    s.config.device_count = kDefaultDeviceCount;
    return orError::Success;
  }
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || value < 1 || value > kMaxDevices) {
    return bad_config(
        s, std::string("OPENREG_DEVICE_COUNT='") + env + "' is not a whole number from 1 to " +
            std::to_string(kMaxDevices) +
            ": set it to the number of simulated openreg devices you want, or unset it for the default of " +
            std::to_string(kDefaultDeviceCount) + ".");
  }
  s.config.device_count = static_cast<int>(value);
  return orError::Success;
}

// Accepts a byte count with an optional binary suffix: "8G", "512M", "65536".
orError read_device_memory(InitState& s) {
  constexpr size_t kMin = size_t{1} << 20;
  constexpr size_t kMax = size_t{1} << 40;
  const char* env = std::getenv("OPENREG_DEVICE_MEMORY");
  if (env == nullptr || *env == '\0') {
    s.config.device_memory = kDefaultDeviceMemory;
    return orError::Success;
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(env, &end, 10);
  int shift = 0;
  if (end != env && *end != '\0' && end[1] == '\0') {
    switch (*end) {
      case 'K': case 'k': shift = 10; ++end; break;
      case 'M': case 'm': shift = 20; ++end; break;
      case 'G': case 'g': shift = 30; ++end; break;
      case 'T': case 't': shift = 40; ++end; break;
      default: break;
    }
  }
  const bool parsed = errno == 0 && end != env && *end == '\0' && *env != '-';
  const size_t bytes = parsed && value <= (kMax >> shift) ? static_cast<size_t>(value) << shift : 0;
  if (bytes < kMin || bytes > kMax) {
    return bad_config(
        s, std::string("OPENREG_DEVICE_MEMORY='") + env +
            "' is not a memory size from 1M to 1T: give bytes, optionally with a K, M, G or T suffix "
            "(e.g. OPENREG_DEVICE_MEMORY=4G), or unset it for the default of " +
            std::to_string(kDefaultDeviceMemory >> 30) + "G per device.");
  }
  // Whole 2 MiB units keep every allocation's pages inside its device.
  constexpr size_t kUnit = size_t{2} << 20;
  s.config.device_memory = (bytes + kUnit - 1) / kUnit * kUnit;
  return orError::Success;
}

// A 0/1 switch from the environment: unset, empty or 0 leaves `flag` false.
orError read_switch(InitState& s, const char* name, const char* what_1_does, bool& flag) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0' || std::string(env) == "0") {
    return orError::Success;
  }
  if (std::string(env) != "1") {
    return bad_config(
        s, std::string(name) + "='" + env + "' is neither 1 nor 0: set it to 1 to " + what_1_does + ", or unset it.");
  }
  flag = true;
  return orError::Success;
}

orError read_launch_blocking(InitState& s) {
  if (const orError status = read_switch(
          s, "OPENREG_LAUNCH_BLOCKING",
          "run every kernel before its launch returns (errors then point at the call that caused them)",
          s.config.launch_blocking);
      status != orError::Success) {
    return status;
  }
  if (const orError status = read_switch(
          s, "OPENREG_QUEUE_ALL_KERNELS", "queue every kernel, a small one on an idle stream too",
          s.config.queue_all_kernels);
      status != orError::Success) {
    return status;
  }
  return read_switch(
      s, "OPENREG_DISCRETE_MEMORY", "keep CPU code from addressing device memory (docs/porting.md)",
      s.config.discrete_memory);
}

void initialize(InitState& s) {
  s.status = read_device_count(s);
  if (s.status == orError::Success) {
    s.status = read_device_memory(s);
  }
  if (s.status == orError::Success) {
    s.status = read_launch_blocking(s);
  }
  if (s.status == orError::Success) {
    s.status = detail::map_device_memory(s.config, &s.message);
  }
  if (s.status == orError::Success) {
    detail::install_fault_handler();
    ready_config.store(&s.config, std::memory_order_release);
  }
}

} // namespace

namespace detail {
orError check_device(int device) {
  int count = 0;
  if (orError status = orGetDeviceCount(&count); status != orError::Success) {
    return status;
  }
  return device >= 0 && device < count ? orError::Success : orError::InvalidDevice;
}

const Config* config() {
  return ready_config.load(std::memory_order_acquire);
}
} // namespace detail

const char* orGetErrorString(orError error) {
  switch (error) {
    case orError::Success: return "no error";
    case orError::InvalidDevice: return "invalid openreg device index";
    case orError::InvalidValue: return "invalid argument";
    case orError::MemoryAllocation: return "out of memory";
    case orError::InvalidPointer: return "pointer is not inside a live openreg allocation";
    case orError::InvalidConfiguration: return "invalid openreg configuration";
    case orError::NotReady: return "work is still pending";
    case orError::InvalidHandle: return "invalid stream or event handle for this call";
    case orError::LaunchFailure: return "a kernel launched earlier failed";
    case orError::StreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case orError::StreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case orError::StreamCaptureUnmatched: return "the stream is not capturing, or is capturing already";
  }
  return "unknown openreg error";
}

orError orInit(const char** message) {
  InitState& s = state();
  if (ready_config.load(std::memory_order_acquire) == nullptr) {
    std::call_once(s.once, [&] { initialize(s); });
  }
  if (message != nullptr) {
    *message = s.message.c_str();
  }
  return s.status;
}

orError orInstallFaultHandler() {
  if (orError status = orInit(); status != orError::Success) {
    return status;
  }
  detail::install_fault_handler();
  return orError::Success;
}

orError orGetDeviceCount(int* count) {
  if (count == nullptr) {
    return orError::InvalidValue;
  }
  const orError status = orInit();
  *count = status == orError::Success ? state().config.device_count : 0;
  return status;
}

orError orGetDevice(int* device) {
  if (device == nullptr) {
    return orError::InvalidValue;
  }
  *device = current_device;
  return orError::Success;
}

orError orSetDevice(int device) {
  if (device == current_device) {
    return orError::Success; // already current, so valid (guards restore this way)
  }
  if (orError status = detail::check_device(device); status != orError::Success) {
    return status;
  }
  current_device = device;
  return orError::Success;
}

orError orGetDeviceProperties(orDeviceProp* prop, int device) {
  if (prop == nullptr) {
    return orError::InvalidValue;
  }
  if (orError status = detail::check_device(device); status != orError::Success) {
    return status;
  }
  *prop = orDeviceProp{};
  std::strncpy(prop->name, "openreg simulated device", sizeof(prop->name) - 1);
  prop->total_memory = state().config.device_memory;
  prop->major = 1;
  prop->minor = 0;
  prop->multi_processor_count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return orError::Success;
}

orError orDeviceSynchronize(int device) {
  if (orError status = detail::check_device(device); status != orError::Success) {
    return status;
  }
  return detail::synchronize_device_streams(device);
}

} // namespace openreg
