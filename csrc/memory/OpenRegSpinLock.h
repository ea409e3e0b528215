// A lock for short critical sections on per-call paths (the caching
// allocator, the CPU-visible registry). Taking it when free is one atomic
// exchange and releasing it one plain store, where a std::mutex costs an
// atomic operation and a library call each way. A waiter spins briefly, then
// yields its core, so a long hold (the allocator synchronizing events in
// empty_cache) costs waiters CPU time but never blocks progress.
#pragma once

#include <atomic>
#include <thread>

namespace openreg {

class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0; busy_.test_and_set(std::memory_order_acquire); ++spins) {
      if (spins < kSpins) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
  }
  void unlock() noexcept {
    busy_.clear(std::memory_order_release);
  }

 private:
  static constexpr int kSpins = 64;
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
};

} // namespace openreg
