// Streams (in-order queues, each served by a worker thread) and events.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "OpenRegRuntimeInternal.h"

namespace openreg {

namespace {
// Tasks queued on any stream of the process and not yet completed. Kernels run
// on the calling thread, so queued tasks (async copies, host functions, event
// markers) are rare: when this is 0, every stream is idle, which a kernel
// launch reads with one load instead of looking up its stream.
std::atomic<uint64_t> pending_tasks{0};
} // namespace

struct orStream {
  orStream(int device, int priority) : device(device), priority(priority), id(next_id.fetch_add(1) + 1) {}

  const int device;
  const int priority;
  const uint64_t id;
  static inline std::atomic<uint64_t> next_id{0};

  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable work_done;
  std::deque<std::function<void()>> queue;
  // Tasks enqueued and completed so far. Written under `mutex`, read without
  // it: a kernel launch on an idle stream costs two atomic loads. Events are
  // positions in this sequence (see EventState), so a stream and the events
  // recorded on it can never disagree about what has completed.
  std::atomic<uint64_t> enqueued{0};
  std::atomic<uint64_t> completed{0};
  bool worker_started = false;

  // Queues `task`; returns its position in the stream's sequence.
  uint64_t enqueue(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!worker_started) {
      // Detached: streams live as long as the process, and a joinable thread
      // in a static destructor would call std::terminate.
      std::thread([this] { serve(); }).detach();
      worker_started = true;
    }
    queue.push_back(std::move(task));
    pending_tasks.fetch_add(1, std::memory_order_relaxed);
    const uint64_t position = enqueued.fetch_add(1, std::memory_order_release) + 1;
    work_ready.notify_one();
    return position;
  }

  void serve() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      work_ready.wait(lock, [this] { return !queue.empty(); });
      std::function<void()> task = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      task();
      lock.lock();
      completed.fetch_add(1, std::memory_order_release);
      pending_tasks.fetch_sub(1, std::memory_order_release);
      work_done.notify_all();
    }
  }

  bool reached(uint64_t position) const {
    return completed.load(std::memory_order_acquire) >= position;
  }

  bool idle() const {
    return reached(enqueued.load(std::memory_order_acquire));
  }

  // Waits until the task at `position` (and so every earlier one) has completed.
  void wait_until(uint64_t position) {
    if (reached(position)) {
      return;
    }
    std::unique_lock<std::mutex> lock(mutex);
    work_done.wait(lock, [&] { return reached(position); });
  }

  // Waits for the work enqueued before the call (not for work added meanwhile).
  void synchronize() {
    wait_until(enqueued.load(std::memory_order_acquire));
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
void synchronize_device_streams(int device) {
  std::vector<orStream*> streams;
  {
    StreamTable& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    streams = t.streams[device];
  }
  for (orStream* stream : streams) {
    stream->synchronize();
  }
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

orError orStreamQuery(orStream_t stream) {
  if (stream == nullptr) {
    return orError::InvalidValue;
  }
  return stream->idle() ? orError::Success : orError::NotReady;
}

orError orStreamQueryAll() {
  // Acquire: reading 0 makes every completed task's writes visible, as
  // orStreamQuery's acquire of a stream's completed count does.
  return pending_tasks.load(std::memory_order_acquire) == 0 ? orError::Success : orError::NotReady;
}

orError orStreamSynchronize(orStream_t stream) {
  if (stream == nullptr) {
    return orError::InvalidValue;
  }
  stream->synchronize();
  return orError::Success;
}

orError orStreamWaitEvent(orStream_t stream, orEvent_t event) {
  if (stream == nullptr || event == nullptr) {
    return orError::InvalidValue;
  }
  std::shared_ptr<EventState> state = event->state;
  const EventState::Point point = event->state->point();
  if (!point.complete()) {
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
    stream->enqueue([to, from, count, report, record = detail::memcpy_record(dst, src, count, kind, stream)]() mutable {
      record.start_ns = orActivityGetTimestamp();
      detail::copy_bytes(to, from, count);
      record.end_ns = orActivityGetTimestamp();
      report(record);
    });
    return orError::Success;
  }
  stream->enqueue([to, from, count] { detail::copy_bytes(to, from, count); });
  return orError::Success;
}

orError orLaunchHostFunc(orStream_t stream, void (*fn)(void*), void* data) {
  if (stream == nullptr || fn == nullptr) {
    return orError::InvalidValue;
  }
  stream->enqueue([fn, data] { fn(data); });
  return orError::Success;
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

} // namespace openreg
