// Work: the handle of one issued collective. Collectives on host tensors
// run in issue order on their group's communication thread; the caller keeps
// computing until it calls wait(). A Work keeps the tensors it was given
// alive until it is done; the caller must not touch their bytes before
// wait() returns.
//
// A collective on device tensors runs on the group's stream of the device,
// as NCCL's do: its Work holds the event recorded after it, and wait() makes
// the caller's current stream wait for that event without blocking the host
// (ProcessGroupNCCL's semantics); its errors surface where the stream's do,
// at a synchronisation.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/stream.h"

namespace tessera::dist {

class Work {
 public:
  // The shared completion state, filled by the communication thread.
  struct State {
    std::string description;  // "all_gather_into #12 on group 'world'"
    std::mutex mutex;
    std::condition_variable completed_cv;
    bool completed = false;
    std::exception_ptr error;
    std::shared_ptr<void> keep_alive;  // the tensors the collective reads or writes
    // Device collectives: the event after the collective on the group's stream.
    std::optional<Event> device_done;
    Device device;
    // all_of: the Works this one stands for (no collective of its own).
    std::vector<Work> parts;

    void complete(std::exception_ptr failure);
  };

  Work() = default;  // a completed no-op
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // One handle on several: wait() waits for each in order (rethrowing the
  // first error), is_completed() when all are, the description lists them.
  static Work all_of(std::vector<Work> parts);

  // Host collectives: blocks until the collective is done and rethrows its
  // error (every time it is called); never forever: the collective itself
  // is bounded by the group's timeout. Device collectives: orders the
  // calling thread's current stream of the device after the collective.
  void wait() const;
  // Whether the collective has run (a device collective: its event reached).
  bool is_completed() const;
  // "all_gather_into #12 on group 'world'", or "" for a no-op.
  std::string description() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tessera::dist
