// Streams and events: the device abstraction for "run this later, in order"
// and "wait until that has happened". A cpu stream is a worker thread with a
// FIFO of tasks (the default stream runs inline); a cuda stream is a
// cudaStream_t on the nvidia runtime and, in the simulator, a worker stream
// that also keeps the clocks of the stream-ordering checker. FSDP expresses
// its overlap once, in these terms, and gets it on every device.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tensor/device.h"

namespace tessera {

class Event;
struct EventState;

class Stream {
 public:
  // The stream work on `device` goes to when none is named: on cpu and meta
  // the default stream, which runs work inline on the caller; on cuda this
  // thread's current stream of the device (never CUDA's legacy default
  // stream, which would serialise everything).
  static std::shared_ptr<Stream> default_stream(Device device);
  // A new stream with its own order of work. On cuda, lower priority values
  // are scheduled first (-1 high, 0 normal); a cpu stream records it only.
  static std::shared_ptr<Stream> create(Device device, int priority = 0);

  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  int priority() const { return priority_; }

  // Runs `task` on this stream after everything enqueued before it.
  virtual void enqueue(std::function<void()> task) = 0;
  // Makes later work on this stream wait until `event` has completed.
  virtual void wait_event(const Event& event) = 0;
  // Blocks until everything enqueued so far has run; rethrows the first error
  // a task raised since the last synchronize.
  virtual void synchronize() = 0;
  // Whether everything enqueued so far has run.
  virtual bool query() = 0;
  // Completes `event` once everything enqueued so far has run (Event::record).
  virtual void record(const std::shared_ptr<EventState>& event) = 0;

 protected:
  Stream(Device device, int priority) : device_(device), priority_(priority) {}

 private:
  Device device_;
  int priority_;
};

// A FIFO of tasks on a worker thread, or inline on the caller: cpu streams,
// and the base of the simulator's cuda streams.
class WorkerStream : public Stream {
 public:
  WorkerStream(Device device, int priority, bool has_worker);
  ~WorkerStream() override;

  void enqueue(std::function<void()> task) override;
  void wait_event(const Event& event) override;
  void synchronize() override;
  bool query() override;
  void record(const std::shared_ptr<EventState>& event) override;

 protected:
  // Runs on the worker before each task (the simulator's jitter).
  virtual void before_task() {}
  // Stops the worker after the work enqueued so far; a derived stream calls
  // it first thing in its destructor, so no task runs against a half-destroyed
  // object.
  void stop_worker();

 private:
  void worker_loop();

  bool has_worker_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  int64_t enqueued_ = 0;
  int64_t finished_ = 0;
  bool stopping_ = false;
  std::exception_ptr first_error_;
  std::thread worker_;
};

// What an Event's copies share with the stream it was recorded on.
struct EventState {
  std::mutex mutex;
  std::condition_variable completed_cv;
  bool completed = true;  // an event never recorded counts as completed
  bool recorded = false;
  std::chrono::steady_clock::time_point completed_at;
  // The simulator's stream-ordering checker: the recording stream's clock at
  // record(), and what to run once the host has seen the event complete
  // (query or synchronize), so that the checker learns what the host knows.
  std::vector<uint64_t> ordering_clock;
  std::function<void()> on_host_observed;
  // The nvidia runtime's cudaEvent_t, which other streams wait on.
  std::shared_ptr<void> native_event;
};

// A marker in a stream: completes when every task enqueued before record()
// has run. Copies share the same completion state.
class Event {
 public:
  Event();
  void record(Stream& stream);
  bool query() const;        // completed?
  void synchronize() const;  // blocks the caller until completed
  // Milliseconds from this event's completion to `end`'s; both must have
  // been recorded and have completed.
  double elapsed_ms(const Event& end) const;
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_;
};

// This thread's current stream for `device` (Stream::default_stream), and a
// guard that makes another one current while it lives.
std::shared_ptr<Stream> current_stream(Device device);
class StreamGuard {
 public:
  explicit StreamGuard(std::shared_ptr<Stream> stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  std::shared_ptr<Stream> stream_;
  std::shared_ptr<Stream> previous_;
};

}  // namespace tessera
