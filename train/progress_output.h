// Rank 0's progress lines reach stdout through a thread of their own, so a
// reader that stops reading never stalls training. mpirun, once signalled,
// stops forwarding its ranks' output while it waits its kill timeout before
// passing the signal on: a rank that kept writing would fill the pipe, block
// in write(), and be killed there instead of saving its checkpoint. A paused
// terminal or a stalled log collector does the same to a long run.
//
// Lines wait in a bounded queue (1 MiB unless set); a line that does not fit
// is dropped, and once the reader catches up a line says how many were.
// Closing waits until every queued line is written, except after a stop
// signal (GracefulStop::requested), when it waits at most a grace period:
// whoever sent the signal may never read again, and the run's state is saved
// by then. The writer thread writes only with write(2), to a duplicate of the
// descriptor that it closes when it ends: leaving it blocked there at exit
// touches nothing the exit tears down, and the caller may close its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>

namespace tessera::train {

class ProgressOutput {
 public:
  struct Options {
    size_t capacity_bytes = size_t{1} << 20;
    // When closing finds lines still queued: whether to stop waiting for them
    // after `grace` (the default: once a stop signal has arrived).
    std::function<bool()> give_up_waiting;
    std::chrono::milliseconds grace{2000};
  };
  explicit ProgressOutput(int fd);
  ProgressOutput(int fd, Options options);
  ~ProgressOutput();  // close()
  ProgressOutput(const ProgressOutput&) = delete;
  ProgressOutput& operator=(const ProgressOutput&) = delete;

  // Where the lines go: whole lines are queued as they end ('\n' or a flush).
  std::ostream& stream();

  // Queues what the stream holds and waits for the queue to empty (within the
  // rules above: a stop signal that arrives while it waits also starts the
  // grace period). Idempotent; the stream must not be used after.
  void close();

  // Lines dropped so far because the queue was full.
  int64_t dropped_lines() const;

 private:
  struct State;
  class Buffer;
  std::shared_ptr<State> state_;  // shared with the writer thread, which may outlive this object
  std::unique_ptr<Buffer> buffer_;
  std::unique_ptr<std::ostream> stream_;
  std::function<bool()> give_up_waiting_;
  std::chrono::milliseconds grace_;
  bool closed_ = false;
};

}  // namespace tessera::train
