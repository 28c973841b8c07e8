// Work: the handle of one issued collective. Collectives run in issue order
// on their group's communication thread; the caller keeps computing until it
// calls wait(). A Work keeps the tensors it was given alive until it is done;
// the caller must not touch their bytes before wait() returns.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

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

    void complete(std::exception_ptr failure);
  };

  Work() = default;  // a completed no-op
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Blocks until the collective is done; rethrows its error (every time it is
  // called). Never blocks forever: the collective itself is bounded by the
  // group's timeout.
  void wait() const;
  bool is_completed() const;
  // "all_gather_into #12 on group 'world'", or "" for a no-op.
  std::string description() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tessera::dist
