// Streams and events: the device abstraction for "run this later, in order"
// and "wait until that has happened". On CPU a stream is a worker thread with
// a FIFO of tasks (or inline execution for the default stream); on CUDA it
// will be a cudaStream_t. FSDP expresses its overlap once, in these terms,
// and gets it on every device.
#pragma once

#include <condition_variable>
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

class Stream {
 public:
  // The default stream of `device`: work enqueued on it runs at once, on the
  // caller's thread.
  static std::shared_ptr<Stream> default_stream(Device device);
  // A new stream with its own worker thread (CPU); work runs in FIFO order,
  // concurrently with the caller.
  static std::shared_ptr<Stream> create(Device device);

  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  // Runs `task` on this stream after everything enqueued before it.
  void enqueue(std::function<void()> task);
  // Makes later work on this stream wait until `event` has completed.
  void wait_event(const Event& event);
  // Blocks until every task enqueued so far has run; rethrows the first error
  // a task raised since the last synchronize.
  void synchronize();

 private:
  Stream(Device device, bool has_worker);
  void worker_loop();

  Device device_;
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

// A marker in a stream: completes when every task enqueued before record()
// has run. Copies share the same completion state.
class Event {
 public:
  Event();
  void record(Stream& stream);
  bool query() const;       // completed?
  void synchronize() const;  // blocks the caller until completed

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable completed_cv;
    bool completed = true;  // an event never recorded counts as completed
  };
  std::shared_ptr<State> state_;
};

}  // namespace tessera
