#include "memory/OpenRegAllocatorConfig.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include <c10/util/Exception.h>

namespace openreg {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
// As CUDA's: below the large pool's 20 MiB segments a limit on splitting
// would keep every large block whole.
constexpr size_t kMinMaxSplitSizeMb = 20;
constexpr const char* kKeys =
    "max_split_size_mb, garbage_collection_threshold, release_threshold_mb, expandable_segments";

// Read on allocation paths without a lock.
std::atomic<size_t> max_split_size{static_cast<size_t>(-1)};
std::atomic<double> garbage_collection_threshold{0.0};
std::atomic<size_t> release_threshold{AllocatorConfig().release_threshold};

std::mutex& settings_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::string& last_settings() {
  static auto* s = new std::string();
  return *s;
}

std::string trim(const std::string& s) {
  size_t begin = 0;
  size_t end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) {
    ++begin;
  }
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) {
    --end;
  }
  return s.substr(begin, end - begin);
}

AllocatorConfig parse(const std::string& settings, const char* source) {
  AllocatorConfig config;
  std::istringstream entries(settings);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    entry = trim(entry);
    if (entry.empty()) {
      continue;
    }
    const size_t colon = entry.find(':');
    TORCH_CHECK_VALUE(
        colon != std::string::npos, source, ": '", entry, "' is not key:value. Accepted keys: ", kKeys, ".");
    const std::string key = trim(entry.substr(0, colon));
    const std::string value = trim(entry.substr(colon + 1));
    char* end = nullptr;
    if (key == "max_split_size_mb") {
      const unsigned long long mb = std::strtoull(value.c_str(), &end, 10);
      TORCH_CHECK_VALUE(
          !value.empty() && std::isdigit(static_cast<unsigned char>(value[0])) && *end == '\0' &&
              mb >= kMinMaxSplitSizeMb && mb <= (static_cast<size_t>(-1) / kMiB),
          source, ": max_split_size_mb takes a whole number of MiB, at least ", kMinMaxSplitSizeMb, "; got '",
          value, "'.");
      config.max_split_size = static_cast<size_t>(mb) * kMiB;
    } else if (key == "garbage_collection_threshold") {
      const double threshold = std::strtod(value.c_str(), &end);
      TORCH_CHECK_VALUE(
          !value.empty() && *end == '\0' && threshold > 0.0 && threshold < 1.0, source,
          ": garbage_collection_threshold takes a number between 0 and 1 (exclusive); got '", value, "'.");
      config.garbage_collection_threshold = threshold;
    } else if (key == "release_threshold_mb") {
      const unsigned long long mb = std::strtoull(value.c_str(), &end, 10);
      TORCH_CHECK_VALUE(
          !value.empty() && std::isdigit(static_cast<unsigned char>(value[0])) && *end == '\0' &&
              mb <= (static_cast<size_t>(-1) / kMiB),
          source, ": release_threshold_mb takes a whole number of MiB (0: give every cached block's pages back); got '",
          value, "'.");
      config.release_threshold = static_cast<size_t>(mb) * kMiB;
    } else if (key == "expandable_segments") {
      TORCH_CHECK_VALUE(
          value == "False" || value == "false" || value == "True" || value == "true", source,
          ": expandable_segments takes True or False; got '", value, "'.");
      TORCH_CHECK_VALUE(
          value == "False" || value == "false", source,
          ": expandable_segments:True is not supported by openreg: its runtime maps each device's memory once "
          "at start, so a segment cannot grow in place. Accepted: False.");
    } else {
      TORCH_CHECK_VALUE(false, source, ": unknown key '", key, "'. Accepted keys: ", kKeys, ".");
    }
  }
  return config;
}

} // namespace

AllocatorConfig allocator_config() {
  AllocatorConfig config;
  config.max_split_size = max_split_size.load(std::memory_order_relaxed);
  config.garbage_collection_threshold = garbage_collection_threshold.load(std::memory_order_relaxed);
  config.release_threshold = release_threshold.load(std::memory_order_relaxed);
  return config;
}

void set_allocator_settings(const std::string& settings, const char* source) {
  const AllocatorConfig config = parse(settings, source);
  const std::lock_guard<std::mutex> lock(settings_mutex());
  max_split_size.store(config.max_split_size, std::memory_order_relaxed);
  garbage_collection_threshold.store(config.garbage_collection_threshold, std::memory_order_relaxed);
  release_threshold.store(config.release_threshold, std::memory_order_relaxed);
  last_settings() = settings;
}

std::string allocator_settings() {
  const std::lock_guard<std::mutex> lock(settings_mutex());
  return last_settings();
}

void load_allocator_config() {
  if (const char* settings = std::getenv("PYTORCH_OPENREG_ALLOC_CONF")) {
    set_allocator_settings(settings, "PYTORCH_OPENREG_ALLOC_CONF");
  }
}

} // namespace openreg
