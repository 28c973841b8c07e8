// Streams and events: the device abstraction for "run this later, in order"
// and "wait until that has happened". A cpu stream is a worker thread with a
// FIFO of tasks (the default stream runs inline); a cuda stream is a
// cudaStream_t on the nvidia runtime and, in the simulator, a worker stream
// that also keeps the clocks of the stream-ordering checker. An Event's
// records are kept by the runtime that made them (EventRecord). FSDP
// expresses its overlap once, in these terms, and gets it on every device.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "tensor/device.h"

namespace tessera {

class Event;
class EventRecord;

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

  // Runs `task` on the host after everything enqueued before it. On cuda it
  // is a host function (cudaLaunchHostFunc): it must make no cuda call (no
  // launch, copy, allocation, event or stream call, and it must not free a
  // cuda tensor), as CUDA refuses them there; the simulator raises a
  // tessera::Error naming the call. It can also stall the stream, so none of
  // tessera's own work (kernels, copies, frees, event records) enqueues one;
  // this is for users' host work.
  virtual void enqueue(std::function<void()> task) = 0;
  // Makes later work on this stream wait until `event`'s latest record has
  // been reached (no wait if it was never recorded).
  virtual void wait_event(const Event& event) = 0;
  // Blocks until everything enqueued so far has run; rethrows the first error
  // a task raised since the last synchronize.
  virtual void synchronize() = 0;
  // Whether everything enqueued so far has run.
  virtual bool query() = 0;
  // Marks the point after everything enqueued so far (Event::record): a
  // timing record also carries the time it is reached, for elapsed_ms.
  virtual std::shared_ptr<EventRecord> record_event(bool timing) = 0;

 protected:
  Stream(Device device, int priority) : device_(device), priority_(priority) {}

 private:
  Device device_;
  int priority_;
};

// One record() of an Event, kept by the runtime of the stream it was
// recorded on: a flag its worker sets (cpu and simulated streams) or a
// pooled cudaEvent_t (nvidia). No host callback is involved on any runtime.
class EventRecord {
 public:
  explicit EventRecord(bool timing) : timing_(timing) {}
  virtual ~EventRecord() = default;
  EventRecord(const EventRecord&) = delete;
  EventRecord& operator=(const EventRecord&) = delete;

  bool timing() const { return timing_; }
  // Whether the stream has run everything enqueued before the record.
  virtual bool reached() = 0;
  // Blocks the calling thread until reached().
  virtual void wait_until_reached() = 0;
  // The host has seen the record reached (Event::query or synchronize): the
  // simulator's stream-ordering checker learns what the host now knows.
  virtual void observed_by_host() {}
  // Milliseconds on the runtime's clock from this record to `end`, a record
  // of the same runtime; both timing and reached.
  virtual double elapsed_ms_until(EventRecord& end) = 0;

 private:
  bool timing_;
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
  std::shared_ptr<EventRecord> record_event(bool timing) override;

 protected:
  // A record its worker marks reached, stamped with clock_ms().
  class Record : public EventRecord {
   public:
    using EventRecord::EventRecord;
    bool reached() override;
    void wait_until_reached() override;
    double elapsed_ms_until(EventRecord& end) override;
    void mark_reached(double at_ms);

   private:
    std::mutex mutex_;
    std::condition_variable reached_cv_;
    bool reached_ = false;
    double reached_at_ms_ = 0;
  };

  // Queues `task` after everything enqueued so far, as it is (enqueue may
  // wrap a user's task; records and waits go straight here).
  void push_task(std::function<void()> task);
  // Queues the marking of `record` (made by the derived stream) as reached.
  void complete_in_order(const std::shared_ptr<Record>& record);
  // The time a record is stamped with when reached: the host's steady clock
  // here, the simulated device clock on a simulated stream.
  virtual double clock_ms();
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

// A marker in a stream: reached when every task enqueued before record() has
// run. Copies share the same state, and a later record() replaces the
// earlier one for them all (as a cudaEvent_t recorded again).
class Event {
 public:
  // An event without timing (cudaEventDisableTiming): the cheap kind, for
  // ordering and completion.
  Event();
  // An event whose records carry a time, for elapsed_ms: on nvidia a
  // cudaEvent_t with timing, on the simulator the simulated device clock, on
  // cpu the host's steady clock.
  static Event timed();

  void record(Stream& stream);
  bool query() const;        // reached? (never recorded: true)
  void synchronize() const;  // blocks the caller until reached
  // Milliseconds from this event's latest record to `end`'s, both made with
  // Event::timed(), recorded on one runtime and reached: GPU time between
  // them on nvidia (cudaEventElapsedTime), simulated time on the simulator.
  double elapsed_ms(const Event& end) const;
  bool timing() const;
  // The latest record, or null before the first (what wait_event waits for).
  std::shared_ptr<EventRecord> latest_record() const;

 private:
  struct State {
    explicit State(bool timing) : timing(timing) {}
    const bool timing;
    std::mutex mutex;
    std::shared_ptr<EventRecord> latest;
  };
  explicit Event(bool timing);
  std::shared_ptr<State> state_;
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
