// Work: completion state shared between the caller and the communication thread.
#include "dist/work.h"

#include <algorithm>

namespace tessera::dist {

void Work::State::complete(std::exception_ptr failure) {
  {
    std::lock_guard lock(mutex);
    error = std::move(failure);
    completed = true;
    keep_alive.reset();  // the buffers are free for the caller again
  }
  completed_cv.notify_all();
}

Work Work::all_of(std::vector<Work> parts) {
  auto state = std::make_shared<State>();
  std::string description;
  for (const Work& part : parts) description += (description.empty() ? "" : ", ") + part.description();
  state->description = "{" + description + "}";
  state->completed = true;
  state->parts = std::move(parts);
  return Work(std::move(state));
}

void Work::wait() const {
  if (!state_) return;
  if (!state_->parts.empty()) {
    for (const Work& part : state_->parts) part.wait();
    return;
  }
  if (state_->device_done) {
    current_stream(state_->device)->wait_event(*state_->device_done);
    return;
  }
  std::unique_lock lock(state_->mutex);
  state_->completed_cv.wait(lock, [&] { return state_->completed; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::is_completed() const {
  if (!state_) return true;
  if (!state_->parts.empty()) {
    return std::all_of(state_->parts.begin(), state_->parts.end(),
                       [](const Work& part) { return part.is_completed(); });
  }
  if (state_->device_done) return state_->device_done->query();
  std::lock_guard lock(state_->mutex);
  return state_->completed;
}

std::string Work::description() const { return state_ ? state_->description : std::string(); }

}  // namespace tessera::dist
