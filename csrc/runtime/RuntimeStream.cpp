// Streams (in-order queues, each served by a worker thread) and events.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "OpenRegRuntimeInternal.h"

namespace openreg {

namespace {
// Tasks queued on any stream of the process and not yet completed. While
// this is 0 and no failure waits to be reported, every stream is idle, which
// a caller about to touch device memory, or to run a small kernel at once,
// reads with two loads instead of looking its stream up (orStreamQueryAll).
std::atomic<uint64_t> pending_tasks{0};
// Streams holding a kernel failure not yet reported.
std::atomic<int> failed_streams{0};

// The stream whose worker this thread is (nullptr on other threads).
thread_local orStream* worker_of = nullptr;
// What the last LaunchFailure returned on this thread reported.
thread_local std::string last_launch_error;

// How long a worker keeps looking for new work, and a waiter for completion,
// before sleeping on a condition variable. Waking a sleeping thread costs
// microseconds, more than a small kernel, so back-to-back launches and a
// synchronize right after them find the other side awake.
constexpr auto kSpin = std::chrono::microseconds(50);

// A host thread that launches while a kernel of the stream has run this long
// yields its core once (orStream::enqueue).
constexpr auto kYieldAfter = std::chrono::microseconds(50);

// A stream's ring holds kRing tasks; at most kMaxPending of them are queued
// and not yet completed, the others completed and not yet released.
constexpr uint64_t kRing = 2048;
constexpr uint64_t kMaxPending = 1024;
// A launch that finds kMaxPending tasks pending waits until kRefill of them
// have completed, so that a launching thread that keeps the queue full is
// woken once per kRefill launches rather than at every completion.
constexpr uint64_t kRefill = 256;
// A launch releases completed tasks once this many are unreleased: reading
// the worker's count of completed tasks moves a cache line between cores.
constexpr uint64_t kReleaseEvery = 64;
// orStream::wake_at while no thread is blocked waiting for the stream.
constexpr uint64_t kNoWaiter = UINT64_MAX;

template <typename Done>
bool spin_until(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) {
      return false;
    }
    std::this_thread::yield();
  }
  return true;
}

// What a task keeps busy while it runs, for orDeviceGetUtilization: a
// kernel (kernels, and host functions, which hold the stream as a kernel
// does: torch.openreg._sleep's wait is one) and the device memory (kernels
// and copies). A wait for another stream or an event's time stamp is neither.
constexpr uint8_t kBusyKernel = 1;
constexpr uint8_t kBusyMemory = 2;

// One unit of queued work: run(args), then release(args). `name` is set for
// kernels, whose exceptions become the stream's failure.
struct Task {
  orKernelFn run = nullptr;
  void* args = nullptr;
  orKernelFn release = nullptr;
  const char* name = nullptr;
  uint8_t busy = 0; // kBusy* bits
};

Task boxed(std::function<void()> fn, uint8_t busy) {
  return Task{
      [](void* f) { (*static_cast<std::function<void()>*>(f))(); },
      new std::function<void()>(std::move(fn)),
      [](void* f) { delete static_cast<std::function<void()>*>(f); },
      nullptr,
      busy};
}

void release_tasks(const std::vector<Task>& tasks) {
  for (const Task& task : tasks) {
    if (task.release != nullptr) {
      task.release(task.args);
    }
  }
}

// A capture under way on a stream (orStreamBeginCapture): the tasks launched
// on it since, in order.
struct Capture {
  orStreamCaptureMode mode;
  std::thread::id thread; // that began it
  std::vector<Task> nodes;
  bool invalidated = false; // a call it cannot record was made: the end fails
};

// Captures under way in the process: while 0, a launch checks no stream's
// capture (one relaxed load).
std::atomic<int> captures_underway{0};
} // namespace

struct orStream {
  orStream(int device, int priority) : device(device), priority(priority), id(next_id.fetch_add(1) + 1) {}

  const int device;
  const int priority;
  const uint64_t id;
  static inline std::atomic<uint64_t> next_id{0};

  // The queue is a ring of kRing tasks by position (task p in slot
  // (p - 1) % kRing): from the oldest not yet released to the newest
  // enqueued. Threads that launch write it under `mutex`; the worker reads the
  // task at a position below `enqueued` without a lock (its slot is not
  // written again before it is released) and runs it in place. It leaves the
  // release to the threads that enqueue or synchronize (reclaim), so what a
  // launch allocated is freed on a launching thread: a thread that allocates
  // and another that frees make glibc's malloc contend for its arena lock on
  // every launch (measured: 3.4 us per queued add of 16 floats, against 1.2
  // us for the add on CPU). At most kMaxPending tasks wait to complete (a
  // driver's launch queue is bounded too); a launch beyond them waits.
  //
  // Fields the launching threads write, those the worker writes, and
  // `enqueued` and `completed` (each written by one side, read by the other)
  // are on cache lines of their own: a launch on another core than the
  // worker's moves as few lines as it can.
  alignas(64) std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable work_done;
  std::unique_ptr<Task[]> ring; // made by the first launch
  uint64_t released = 0;        // tasks released so far; under `mutex`
  bool worker_started = false;  // under `mutex`
  bool worker_asleep = false;   // under `mutex`
  // The lowest position a thread blocked in wait_until waits for
  // (kNoWaiter while none is blocked); written under `mutex`, read by the
  // worker after every task, so on a line of its own: on the mutex's line,
  // that read pulled the line back from the launching core every launch. The
  // worker wakes the blocked threads once its completed count reaches it, not
  // at every completion: a synchronize blocked behind 100 tasks is woken
  // once, not 100 times (tests/test_async.py), and neither its core nor the
  // worker's pays for the rest.
  alignas(64) std::atomic<uint64_t> wake_at{kNoWaiter};

  // Tasks enqueued and completed so far. Enqueued is written under `mutex`,
  // completed by the worker alone; both are read without a lock: a query of
  // an idle stream costs two atomic loads. Events are positions in this
  // sequence (see EventState), so a stream and the events recorded on it can
  // never disagree about what has completed.
  alignas(64) std::atomic<uint64_t> enqueued{0};
  alignas(64) std::atomic<uint64_t> completed{0};
  uint64_t taken = 0; // tasks the worker took; the worker's own
  std::atomic<uint8_t> busy{0}; // the running task's kBusy* bits; written by the worker, sampled
  // When the running kernel started (steady clock ticks), 0 while the worker
  // runs no kernel: written by the worker, read by launches.
  std::atomic<int64_t> kernel_since{0};

  // The capture under way on this stream, if any (orStreamBeginCapture), and
  // whether there is one, read without the lock by every launch while a
  // capture is under way anywhere.
  std::mutex capture_mutex;
  std::unique_ptr<Capture> capture; // under capture_mutex
  std::atomic<bool> capturing{false};

  // The first failure of a kernel not yet reported.
  alignas(64) std::mutex failure_mutex;
  std::string failure;
  std::atomic<bool> failed{false};

  Task& slot(uint64_t position) {
    return ring[(position - 1) % kRing];
  }

  // Moves the completed tasks not yet released into `out`; under `mutex`.
  void take_completed(std::vector<Task>& out) {
    for (const uint64_t done = completed.load(std::memory_order_acquire); released < done;) {
      out.push_back(slot(++released));
    }
  }

  // Releases the tasks the worker has completed, in the calling thread.
  void reclaim() {
    std::vector<Task> finished = release_buffer();
    {
      std::lock_guard<std::mutex> lock(mutex);
      take_completed(finished);
    }
    release(std::move(finished));
  }

  // The calling thread's buffer for tasks to release, empty, kept between
  // launches; a release that launches (a kernel's argument freed to the
  // allocator, say) finds it taken and starts a new one.
  static std::vector<Task>& spare_buffer() {
    thread_local std::vector<Task> spare;
    return spare;
  }
  static std::vector<Task> release_buffer() {
    return std::move(spare_buffer());
  }
  static void release(std::vector<Task>&& tasks) {
    for (const Task& task : tasks) {
      if (task.release != nullptr) {
        task.release(task.args);
      }
    }
    tasks.clear();
    spare_buffer() = std::move(tasks);
  }

  bool is_capturing() const {
    return captures_underway.load(std::memory_order_relaxed) > 0 && capturing.load(std::memory_order_acquire);
  }

  // Records `task` into the stream's capture, if it captures (a capture that
  // was invalidated drops it); false, doing nothing, if it does not.
  bool record_in_capture(const Task& task) {
    if (!is_capturing()) {
      return false;
    }
    std::unique_lock<std::mutex> lock(capture_mutex);
    if (capture == nullptr) {
      return false;
    }
    if (!capture->invalidated) {
      capture->nodes.push_back(task);
      return true;
    }
    lock.unlock();
    release_tasks({task});
    return true;
  }

  // A call a capture cannot record, made on this stream: StreamCaptureUnsupported
  // and the capture invalidated if it captures (`device_wide`, for a device
  // synchronization: only if the capture's mode refuses it from the calling
  // thread); Success otherwise.
  orError refuse_if_capturing(bool device_wide = false) {
    if (!is_capturing()) {
      return orError::Success;
    }
    std::lock_guard<std::mutex> lock(capture_mutex);
    if (capture == nullptr) {
      return orError::Success;
    }
    if (device_wide &&
        (capture->mode == orStreamCaptureModeRelaxed ||
         (capture->mode == orStreamCaptureModeThreadLocal && capture->thread != std::this_thread::get_id()))) {
      return orError::Success;
    }
    capture->invalidated = true;
    return orError::StreamCaptureUnsupported;
  }

  // Records `task` if the stream captures, else queues it.
  void submit(const Task& task) {
    if (!record_in_capture(task)) {
      enqueue(task);
    }
  }

  // A host thread launching beside a kernel that has run for kYieldAfter
  // yields its core once. The device's kernels run on the host's cores: with
  // the host thread busy launching, a kernel's OpenMP threads outnumber the
  // free cores, and each barrier of theirs waits for the thread the launching
  // thread displaced (oneDNN's LSTM has one per time step); a yield per
  // launch lets it through sooner. A short kernel is left alone: a sequence
  // of small launches keeps its pace.
  void yield_to_long_kernel() const {
    if (worker_of != nullptr) {
      return;
    }
    const int64_t since = kernel_since.load(std::memory_order_relaxed);
    if (since != 0 &&
        std::chrono::steady_clock::now().time_since_epoch().count() - since >
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(kYieldAfter).count()) {
      std::this_thread::yield();
    }
  }

  // Queues `task`; returns its position in the stream's sequence.
  uint64_t enqueue(Task task) {
    yield_to_long_kernel();
    if (worker_of != this) {
      const uint64_t done = completed.load(std::memory_order_acquire);
      if (const uint64_t n = enqueued.load(std::memory_order_acquire); n - done >= kMaxPending) {
        wait_until(n - kMaxPending + kRefill);
      }
    }
    std::vector<Task> finished = release_buffer();
    std::unique_lock<std::mutex> lock(mutex);
    if (!worker_started) {
      ring = std::make_unique<Task[]>(kRing);
      // Detached: streams live as long as the process, and a joinable thread
      // in a static destructor would call std::terminate.
      std::thread([this] { serve(); }).detach();
      worker_started = true;
    }
    const uint64_t position = enqueued.load(std::memory_order_relaxed) + 1;
    if (position - released > kReleaseEvery) {
      take_completed(finished);
    }
    while (position - released > kRing) {
      // Other threads' launches filled the ring past kMaxPending meanwhile
      // (or the worker queues on its own stream, which it cannot wait for).
      if (worker_of == this) {
        throw std::length_error("openreg: a stream's worker filled its own queue");
      }
      lock.unlock();
      wait_until(position - kRing);
      lock.lock();
      take_completed(finished);
    }
    slot(position) = task;
    pending_tasks.fetch_add(1, std::memory_order_relaxed);
    enqueued.store(position, std::memory_order_release);
    const bool wake = worker_asleep;
    lock.unlock();
    if (wake) {
      work_ready.notify_one();
    }
    release(std::move(finished));
    return position;
  }

  uint64_t enqueue(std::function<void()> fn, uint8_t busy = 0) {
    return enqueue(boxed(std::move(fn), busy));
  }

  // Waits for the work enqueued before the call (not for work added
  // meanwhile); reports a kernel failure.
  orError synchronize() {
    if (const orError refused = refuse_if_capturing(); refused != orError::Success) {
      return refused;
    }
    wait_until(enqueued.load(std::memory_order_acquire));
    reclaim();
    return take_failure();
  }

  const Task& next() {
    if (!spin_until([this] { return enqueued.load(std::memory_order_acquire) != taken; })) {
      std::unique_lock<std::mutex> lock(mutex);
      worker_asleep = true;
      work_ready.wait(lock, [this] { return enqueued.load(std::memory_order_relaxed) != taken; });
      worker_asleep = false;
    }
    return slot(++taken);
  }

  void serve() {
    worker_of = this;
    for (;;) {
      run(next());
      // Sequentially consistent with wait_until: either the worker sees the
      // position a thread registered and wakes it, or that thread sees this
      // completion before it sleeps.
      const uint64_t done = completed.fetch_add(1) + 1;
      pending_tasks.fetch_sub(1, std::memory_order_release);
      if (done >= wake_at.load()) {
        std::lock_guard<std::mutex> lock(mutex);
        wake_at.store(kNoWaiter);
        work_done.notify_all();
      }
    }
  }

  void run(const Task& task) {
    busy.store(task.busy, std::memory_order_relaxed);
    if (task.busy == (kBusyKernel | kBusyMemory)) {
      kernel_since.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    }
    struct Idle {
      std::atomic<uint8_t>& busy;
      std::atomic<int64_t>& kernel_since;
      ~Idle() {
        busy.store(0, std::memory_order_relaxed);
        kernel_since.store(0, std::memory_order_relaxed);
      }
    } idle_after{busy, kernel_since};
    if (task.name == nullptr) {
      task.run(task.args);
    } else {
      try {
        task.run(task.args);
      } catch (const std::exception& e) {
        fail(task.name, e.what());
      } catch (...) {
        fail(task.name, "unknown exception");
      }
    }
  }

  void fail(const char* name, const char* message) {
    std::lock_guard<std::mutex> lock(failure_mutex);
    if (!failed.load(std::memory_order_relaxed)) {
      failure = std::string(name) + ": " + message;
      failed.store(true, std::memory_order_release);
      failed_streams.fetch_add(1, std::memory_order_release);
    }
  }

  // LaunchFailure, once, if a kernel failed since the last report.
  orError take_failure() {
    if (!failed.load(std::memory_order_acquire)) {
      return orError::Success;
    }
    std::lock_guard<std::mutex> lock(failure_mutex);
    if (!failed.load(std::memory_order_relaxed)) {
      return orError::Success;
    }
    last_launch_error = std::move(failure);
    failure.clear();
    failed.store(false, std::memory_order_relaxed);
    failed_streams.fetch_sub(1, std::memory_order_release);
    return orError::LaunchFailure;
  }

  bool reached(uint64_t position) const {
    return completed.load(std::memory_order_acquire) >= position;
  }

  bool idle() const {
    return reached(enqueued.load(std::memory_order_acquire));
  }

  // Waits until the task at `position` (and so every earlier one) has
  // completed. On the stream's own worker, the work queued before the running
  // task has completed and later work cannot be waited for: returns at once.
  void wait_until(uint64_t position) {
    if (reached(position) || worker_of == this || spin_until([&] { return reached(position); })) {
      return;
    }
    std::unique_lock<std::mutex> lock(mutex);
    // A thread woken for a lower position (or spuriously) registers again.
    // Both accesses are sequentially consistent (not reached()'s acquire
    // load), as serve()'s increment and its read of wake_at are.
    for (;;) {
      if (position < wake_at.load()) {
        wake_at.store(position);
      }
      if (completed.load() >= position) {
        return;
      }
      work_done.wait(lock);
    }
  }
};

namespace {

// An event is a position in one stream's sequence of tasks: the last record
// sets (stream, position), and the event has completed once that stream has
// completed the task at that position. Deriving it from the stream's own
// counter (rather than completing the event from a task) means that once the
// event is seen complete, the stream is seen to have done that work, and once
// a stream is seen idle, every event recorded on it is seen complete.
// Shared, so a queued timing marker stays valid when the caller destroys the
// event handle before the marker runs (a queued wait copies its Point).
struct EventState {
  explicit EventState(unsigned flags) : timing((flags & orEventDisableTiming) == 0) {}

  const bool timing;
  std::mutex mutex;
  orStream* stream = nullptr; // of the last record; streams are never destroyed
  uint64_t position = 0;
  uint64_t generation = 0; // number of records, so a stale timing task is ignored
  std::chrono::steady_clock::time_point time;

  struct Point {
    orStream* stream;
    uint64_t position;
    bool complete() const {
      return stream == nullptr || stream->reached(position);
    }
  };

  Point point() {
    std::lock_guard<std::mutex> lock(mutex);
    return {stream, position};
  }
};

void record(const std::shared_ptr<EventState>& state, orStream* stream) {
  std::unique_lock<std::mutex> lock(state->mutex);
  const uint64_t generation = ++state->generation;
  if (stream->idle()) {
    state->stream = stream;
    state->position = stream->enqueued.load(std::memory_order_acquire);
    state->time = std::chrono::steady_clock::now();
    return;
  }
  lock.unlock();
  // A marker task: it stamps the time when the stream reaches it. Its position
  // is known once it is enqueued; until then, queries see the previous record.
  const uint64_t position = stream->enqueue([state, generation] {
    std::lock_guard<std::mutex> task_lock(state->mutex);
    if (state->generation == generation) {
      state->time = std::chrono::steady_clock::now();
    }
  });
  lock.lock();
  if (state->generation == generation) {
    state->stream = stream;
    state->position = position;
  }
}

} // namespace

struct orEvent {
  explicit orEvent(unsigned flags) : state(std::make_shared<EventState>(flags)) {}
  std::shared_ptr<EventState> state;
};

namespace {

constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -1;

// Every stream of each device, so device synchronization can reach them.
struct StreamTable {
  std::mutex mutex;
  std::array<std::vector<orStream*>, kMaxDevices> streams;
  std::array<orStream*, kMaxDevices> defaults{};
};

StreamTable& table() {
  static auto* t = new StreamTable(); // leaked: streams outlive static dtors
  return *t;
}

orStream* make_stream(int device, int priority, bool is_default) {
  auto* stream = new orStream(device, priority);
  StreamTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.streams[device].push_back(stream);
  if (is_default) {
    t.defaults[device] = stream;
  }
  return stream;
}

} // namespace

namespace detail {
void wait_device_streams(int device) {
  std::vector<orStream*> streams;
  {
    StreamTable& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    streams = t.streams[device];
  }
  for (orStream* stream : streams) {
    stream->wait_until(stream->enqueued.load(std::memory_order_acquire));
  }
}

orError synchronize_device_streams(int device) {
  std::vector<orStream*> streams;
  {
    StreamTable& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    streams = t.streams[device];
  }
  for (orStream* stream : streams) {
    if (const orError refused = stream->refuse_if_capturing(/*device_wide=*/true); refused != orError::Success) {
      return refused;
    }
  }
  orError status = orError::Success;
  for (orStream* stream : streams) {
    if (stream->is_capturing()) {
      continue; // a relaxed capture (or another thread's): nothing of it is queued
    }
    if (const orError err = stream->synchronize(); status == orError::Success) {
      status = err;
    }
  }
  return status;
}
} // namespace detail

orError orDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least == nullptr || greatest == nullptr) {
    return orError::InvalidValue;
  }
  *least = kLeastPriority;
  *greatest = kGreatestPriority;
  return orError::Success;
}

orError orStreamGetDefault(orStream_t* stream, int device) {
  if (stream == nullptr) {
    return orError::InvalidValue;
  }
  if (orError status = detail::check_device(device); status != orError::Success) {
    return status;
  }
  static std::array<std::once_flag, kMaxDevices> once;
  std::call_once(once[device], [&] { make_stream(device, kLeastPriority, /*is_default=*/true); });
  StreamTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  *stream = t.defaults[device];
  return orError::Success;
}

orError orStreamCreateWithPriority(orStream_t* stream, int priority) {
  if (stream == nullptr) {
    return orError::InvalidValue;
  }
  int device = 0;
  orGetDevice(&device);
  if (orError status = detail::check_device(device); status != orError::Success) {
    return status;
  }
  priority = std::min(kLeastPriority, std::max(kGreatestPriority, priority));
  *stream = make_stream(device, priority, /*is_default=*/false);
  return orError::Success;
}

orError orStreamGetDevice(orStream_t stream, int* device) {
  if (stream == nullptr || device == nullptr) {
    return orError::InvalidValue;
  }
  *device = stream->device;
  return orError::Success;
}

orError orStreamGetPriority(orStream_t stream, int* priority) {
  if (stream == nullptr || priority == nullptr) {
    return orError::InvalidValue;
  }
  *priority = stream->priority;
  return orError::Success;
}

orError orStreamGetId(orStream_t stream, uint64_t* id) {
  if (stream == nullptr || id == nullptr) {
    return orError::InvalidValue;
  }
  *id = stream->id;
  return orError::Success;
}

orError orStreamGetQueuedCount(orStream_t stream, uint64_t* count) {
  if (stream == nullptr || count == nullptr) {
    return orError::InvalidValue;
  }
  *count = stream->enqueued.load(std::memory_order_acquire);
  return orError::Success;
}

orError orStreamQuery(orStream_t stream) {
  if (stream == nullptr) {
    return orError::InvalidValue;
  }
  if (const orError refused = stream->refuse_if_capturing(); refused != orError::Success) {
    return refused;
  }
  return stream->idle() ? stream->take_failure() : orError::NotReady;
}

orError orStreamQueryAll() {
  // Acquire: reading 0 makes every completed task's writes visible, as
  // orStreamQuery's acquire of a stream's completed count does.
  return pending_tasks.load(std::memory_order_acquire) == 0 && failed_streams.load(std::memory_order_acquire) == 0 &&
          captures_underway.load(std::memory_order_relaxed) == 0
      ? orError::Success
      : orError::NotReady;
}

orError orStreamIsIdle(orStream_t stream, bool* idle) {
  if (stream == nullptr || idle == nullptr) {
    return orError::InvalidValue;
  }
  *idle = stream->idle() && !stream->is_capturing();
  return orError::Success;
}

orError orStreamSynchronize(orStream_t stream) {
  if (stream == nullptr) {
    return orError::InvalidValue;
  }
  return stream->synchronize();
}

orError orStreamWaitEvent(orStream_t stream, orEvent_t event) {
  if (stream == nullptr || event == nullptr) {
    return orError::InvalidValue;
  }
  std::shared_ptr<EventState> state = event->state;
  const EventState::Point point = event->state->point();
  if (!point.complete()) {
    if (const orError refused = stream->refuse_if_capturing(); refused != orError::Success) {
      return refused;
    }
    stream->enqueue([point] { point.stream->wait_until(point.position); });
  }
  return orError::Success;
}

orError orMemcpyAsync(void* dst, const void* src, size_t count, orMemcpyKind kind, orStream_t stream) {
  if (stream == nullptr) {
    return orError::InvalidValue;
  }
  // Validate now, so the caller gets the error; copy later, on the worker.
  if (const orError err = detail::check_copy(dst, src, count, kind); err != orError::Success || count == 0) {
    return err;
  }
  void* to = orKernelAddress(dst);
  const void* from = orKernelAddress(src);
  if (orActivityCallback report = detail::activity_callback()) {
    // The record is made now, on the issuing thread, for its correlation id;
    // the worker times the copy when it runs.
    stream->submit(boxed(
        [to, from, count, report, record = detail::memcpy_record(dst, src, count, kind, stream)]() mutable {
          record.start_ns = orActivityGetTimestamp();
          detail::copy_bytes(to, from, count);
          record.end_ns = orActivityGetTimestamp();
          report(record);
        },
        kBusyMemory));
    return orError::Success;
  }
  stream->submit(boxed([to, from, count] { detail::copy_bytes(to, from, count); }, kBusyMemory));
  return orError::Success;
}

orError orLaunchHostFunc(orStream_t stream, void (*fn)(void*), void* data) {
  if (stream == nullptr || fn == nullptr) {
    return orError::InvalidValue;
  }
  stream->submit(Task{fn, data, nullptr, nullptr, kBusyKernel});
  return orError::Success;
}

orError orLaunchKernel(orStream_t stream, orKernelFn kernel, void* args, orKernelFn release, const char* name) {
  if (stream == nullptr || kernel == nullptr || name == nullptr) {
    return orError::InvalidValue;
  }
  if (worker_of != nullptr) {
    // A kernel launching another: run it now, in the launching kernel's
    // place in its stream; a failure fails the launching kernel.
    struct Release {
      orKernelFn release;
      void* args;
      ~Release() {
        if (release != nullptr) {
          release(args);
        }
      }
    } release_after{release, args};
    kernel(args);
    return orError::Success;
  }
  const Task task{kernel, args, release, name, kBusyKernel | kBusyMemory};
  if (stream->record_in_capture(task)) {
    return orError::Success; // nothing runs while capturing
  }
  stream->enqueue(task);
  if (const detail::Config* config = detail::config(); config != nullptr && config->launch_blocking) {
    return stream->synchronize();
  }
  return orError::Success;
}

bool orInsideKernel() {
  return worker_of != nullptr;
}

bool orLaunchBlocking() {
  const detail::Config* config = detail::config();
  return config != nullptr && config->launch_blocking;
}

bool orQueueAllKernels() {
  const detail::Config* config = detail::config();
  return config != nullptr && config->queue_all_kernels;
}

const char* orGetLaunchError() {
  return last_launch_error.c_str();
}

orError orEventCreateWithFlags(orEvent_t* event, unsigned flags) {
  if (event == nullptr || (flags & ~unsigned{orEventDisableTiming}) != 0) {
    return orError::InvalidValue;
  }
  *event = new orEvent(flags);
  return orError::Success;
}

orError orEventDestroy(orEvent_t event) {
  if (event == nullptr) {
    return orError::InvalidValue;
  }
  // Queued records and waits hold the state, so destroying an event in use is
  // safe and does not block (CUDA defers the release the same way).
  delete event;
  return orError::Success;
}

orError orEventRecord(orEvent_t event, orStream_t stream) {
  if (event == nullptr || stream == nullptr) {
    return orError::InvalidValue;
  }
  if (const orError refused = stream->refuse_if_capturing(); refused != orError::Success) {
    return refused;
  }
  record(event->state, stream);
  return orError::Success;
}

orError orEventQuery(orEvent_t event) {
  if (event == nullptr) {
    return orError::InvalidValue;
  }
  return event->state->point().complete() ? orError::Success : orError::NotReady;
}

orError orEventSynchronize(orEvent_t event) {
  if (event == nullptr) {
    return orError::InvalidValue;
  }
  const EventState::Point point = event->state->point();
  if (point.stream != nullptr) {
    point.stream->wait_until(point.position);
    return point.stream->take_failure();
  }
  return orError::Success;
}

orError orEventElapsedTime(float* ms, orEvent_t start, orEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) {
    return orError::InvalidValue;
  }
  EventState& first = *start->state;
  EventState& last = *end->state;
  if (!first.timing || !last.timing) {
    return orError::InvalidHandle;
  }
  std::unique_lock<std::mutex> start_lock(first.mutex, std::defer_lock);
  std::unique_lock<std::mutex> end_lock(last.mutex, std::defer_lock);
  if (start == end) {
    start_lock.lock();
  } else {
    std::lock(start_lock, end_lock);
  }
  if (first.stream == nullptr || last.stream == nullptr) {
    return orError::InvalidHandle;
  }
  if (!first.stream->reached(first.position) || !last.stream->reached(last.position)) {
    return orError::NotReady;
  }
  *ms = std::chrono::duration<float, std::milli>(last.time - first.time).count();
  return orError::Success;
}

// -- graphs -------------------------------------------------------------------

namespace {
// A graph's recorded tasks, released when the graph is destroyed and the
// launches queued before have completed (each launch's last task holds them).
struct GraphNodes {
  std::vector<Task> tasks;
  GraphNodes() = default;
  GraphNodes(const GraphNodes&) = delete;
  GraphNodes& operator=(const GraphNodes&) = delete;
  ~GraphNodes() {
    release_tasks(tasks);
  }
};
using SharedNodes = std::shared_ptr<const GraphNodes>;
} // namespace

struct orGraph {
  explicit orGraph(SharedNodes nodes) : nodes(std::move(nodes)) {}
  const SharedNodes nodes;
  std::mutex mutex; // orders launches
  orStream* last_stream = nullptr; // of the last launch, and its last task
  uint64_t last_position = 0;
};

orError orStreamBeginCapture(orStream_t stream, orStreamCaptureMode mode) {
  if (stream == nullptr || mode < orStreamCaptureModeGlobal || mode > orStreamCaptureModeRelaxed) {
    return orError::InvalidValue;
  }
  std::lock_guard<std::mutex> lock(stream->capture_mutex);
  if (stream->capture != nullptr) {
    return orError::StreamCaptureUnmatched;
  }
  stream->capture = std::make_unique<Capture>(Capture{mode, std::this_thread::get_id(), {}, false});
  captures_underway.fetch_add(1);
  stream->capturing.store(true, std::memory_order_release);
  return orError::Success;
}

orError orStreamEndCapture(orStream_t stream, orGraph_t* graph) {
  if (stream == nullptr || graph == nullptr) {
    return orError::InvalidValue;
  }
  std::unique_ptr<Capture> capture;
  {
    std::lock_guard<std::mutex> lock(stream->capture_mutex);
    if (stream->capture == nullptr) {
      return orError::StreamCaptureUnmatched;
    }
    capture = std::move(stream->capture);
    stream->capturing.store(false, std::memory_order_release);
    captures_underway.fetch_sub(1);
  }
  auto nodes = std::make_shared<GraphNodes>();
  nodes->tasks = std::move(capture->nodes);
  if (capture->invalidated) {
    return orError::StreamCaptureInvalidated; // `nodes` releases what was recorded
  }
  *graph = new orGraph(std::move(nodes));
  return orError::Success;
}

orError orStreamIsCapturing(orStream_t stream, bool* capturing) {
  if (stream == nullptr || capturing == nullptr) {
    return orError::InvalidValue;
  }
  *capturing = stream->is_capturing();
  return orError::Success;
}

bool orStreamCaptureUnderway() {
  return captures_underway.load(std::memory_order_relaxed) > 0;
}

orError orGraphLaunch(orGraph_t graph, orStream_t stream) {
  if (graph == nullptr || stream == nullptr) {
    return orError::InvalidValue;
  }
  if (const orError refused = stream->refuse_if_capturing(); refused != orError::Success) {
    return refused;
  }
  std::lock_guard<std::mutex> lock(graph->mutex);
  // A graph's launches never overlap (its nodes reuse the same memory), as
  // CUDA orders a graph's launch after its previous one.
  if (orStream* last = graph->last_stream; last != nullptr && last != stream && !last->reached(graph->last_position)) {
    stream->enqueue([last, position = graph->last_position] { last->wait_until(position); });
  }
  for (const Task& node : graph->nodes->tasks) {
    stream->enqueue(Task{node.run, node.args, nullptr, node.name, node.busy});
  }
  graph->last_position = stream->enqueue(Task{
      [](void*) {}, new SharedNodes(graph->nodes), [](void* nodes) { delete static_cast<SharedNodes*>(nodes); },
      nullptr, 0});
  graph->last_stream = stream;
  if (const detail::Config* config = detail::config(); config != nullptr && config->launch_blocking) {
    return stream->synchronize();
  }
  return orError::Success;
}

orError orGraphDestroy(orGraph_t graph) {
  if (graph == nullptr) {
    return orError::InvalidValue;
  }
  delete graph;
  return orError::Success;
}

orError orGraphGetNodeCount(orGraph_t graph, size_t* count) {
  if (graph == nullptr || count == nullptr) {
    return orError::InvalidValue;
  }
  *count = graph->nodes->tasks.size();
  return orError::Success;
}

orError orGraphDebugDotPrint(orGraph_t graph, const char* path) {
  if (graph == nullptr || path == nullptr) {
    return orError::InvalidValue;
  }
  std::ofstream out(path);
  if (!out) {
    return orError::InvalidValue;
  }
  out << "digraph openreg_graph {\n";
  const std::vector<Task>& tasks = graph->nodes->tasks;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const char* what = tasks[i].name != nullptr ? tasks[i].name
        : (tasks[i].busy & kBusyKernel) != 0    ? "host function"
                                                : "memcpy";
    out << "  n" << i << " [label=\"" << i << ": " << what << "\"];\n";
    if (i > 0) {
      out << "  n" << i - 1 << " -> n" << i << ";\n";
    }
  }
  out << "}\n";
  return out ? orError::Success : orError::InvalidValue;
}

namespace {

// orDeviceGetUtilization's samples: from its first call on, a thread looks
// every kSampleEvery at what each device's streams are running and keeps the
// last kSamples looks per device, as NVML samples a GPU.
constexpr auto kSampleEvery = std::chrono::milliseconds(1);
constexpr size_t kSamples = 1000; // a second

struct Utilization {
  std::mutex mutex;
  std::array<std::deque<uint8_t>, kMaxDevices> samples; // kBusy* bits, oldest first
  std::array<size_t, kMaxDevices> kernel{}; // samples with kBusyKernel
  std::array<size_t, kMaxDevices> memory{}; // samples with kBusyMemory
};

Utilization& utilization() {
  static auto* u = new Utilization(); // leaked: the sampler outlives static dtors
  return *u;
}

// Whether orDeviceGetUtilization has started sampling (orMarkKernel marks nothing before).
std::atomic<bool> sampling{false};

// The device each thread that ran a kernel itself runs one of now (-1: none).
struct MarkedThreads {
  std::mutex mutex;
  std::vector<const std::atomic<int>*> slots;
};

MarkedThreads& marked_threads() {
  static auto* m = new MarkedThreads(); // leaked: threads may end after static dtors
  return *m;
}

// The calling thread's slot, registered at its first mark, removed at its end.
struct MarkSlot {
  std::atomic<int> device{-1};
  MarkSlot() {
    MarkedThreads& m = marked_threads();
    std::lock_guard<std::mutex> lock(m.mutex);
    m.slots.push_back(&device);
  }
  ~MarkSlot() {
    MarkedThreads& m = marked_threads();
    std::lock_guard<std::mutex> lock(m.mutex);
    m.slots.erase(std::find(m.slots.begin(), m.slots.end(), &device));
  }
};

void sample_forever(int device_count) {
  Utilization& u = utilization();
  std::array<uint8_t, kMaxDevices> bits{};
  for (;;) {
    std::this_thread::sleep_for(kSampleEvery);
    bits.fill(0);
    {
      StreamTable& t = table();
      std::lock_guard<std::mutex> lock(t.mutex);
      for (int d = 0; d < device_count; ++d) {
        for (const orStream* stream : t.streams[d]) {
          bits[d] |= stream->busy.load(std::memory_order_relaxed);
        }
      }
    }
    {
      MarkedThreads& m = marked_threads();
      std::lock_guard<std::mutex> lock(m.mutex);
      for (const std::atomic<int>* slot : m.slots) {
        const int d = slot->load(std::memory_order_relaxed);
        if (d >= 0 && d < device_count) {
          bits[d] |= kBusyKernel | kBusyMemory;
        }
      }
    }
    std::lock_guard<std::mutex> lock(u.mutex);
    for (int d = 0; d < device_count; ++d) {
      auto& samples = u.samples[d];
      if (samples.size() == kSamples) {
        u.kernel[d] -= (samples.front() & kBusyKernel) != 0;
        u.memory[d] -= (samples.front() & kBusyMemory) != 0;
        samples.pop_front();
      }
      samples.push_back(bits[d]);
      u.kernel[d] += (bits[d] & kBusyKernel) != 0;
      u.memory[d] += (bits[d] & kBusyMemory) != 0;
    }
  }
}

unsigned percent(size_t part, size_t whole) {
  return whole == 0 ? 0 : static_cast<unsigned>((100 * part + whole / 2) / whole);
}

} // namespace

void orMarkKernel(int device) noexcept {
  // Nothing to do (a load) until orDeviceGetUtilization first runs; then the
  // thread's slot (registered at its first mark) takes a store.
  if (!sampling.load(std::memory_order_relaxed)) {
    return;
  }
  thread_local MarkSlot slot;
  slot.device.store(device, std::memory_order_relaxed);
}

orError orDeviceGetUtilization(int device, unsigned* kernel_percent, unsigned* memory_percent) {
  if (kernel_percent == nullptr || memory_percent == nullptr) {
    return orError::InvalidValue;
  }
  if (orError status = detail::check_device(device); status != orError::Success) {
    return status;
  }
  static std::once_flag started;
  std::call_once(started, [] {
    int count = 0;
    (void)orGetDeviceCount(&count);
    std::thread([count] { sample_forever(count); }).detach();
    sampling.store(true, std::memory_order_relaxed);
  });
  Utilization& u = utilization();
  std::lock_guard<std::mutex> lock(u.mutex);
  *kernel_percent = percent(u.kernel[device], u.samples[device].size());
  *memory_percent = percent(u.memory[device], u.samples[device].size());
  return orError::Success;
}

} // namespace openreg
