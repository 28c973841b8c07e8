// CPU streams (a worker thread per stream) and events.
#include "tensor/stream.h"

#include <array>

#include "tensor/error.h"

namespace tessera {

std::shared_ptr<Stream> Stream::default_stream(Device device) {
  static std::array<std::shared_ptr<Stream>, kNumDeviceTypes> defaults = {
      std::shared_ptr<Stream>(new Stream(kCPU, false)),
      std::shared_ptr<Stream>(new Stream(Device(DeviceType::cuda), false)),
      std::shared_ptr<Stream>(new Stream(kMeta, false)),
  };
  TESSERA_CHECK(!device.is_cuda(), "Stream: CUDA streams need a CUDA build");
  return defaults[static_cast<int>(device.type)];
}

std::shared_ptr<Stream> Stream::create(Device device) {
  TESSERA_CHECK(!device.is_cuda(), "Stream: CUDA streams need a CUDA build");
  return std::shared_ptr<Stream>(new Stream(device, true));
}

Stream::Stream(Device device, bool has_worker) : device_(device), has_worker_(has_worker) {
  if (has_worker_) worker_ = std::thread([this] { worker_loop(); });
}

Stream::~Stream() {
  if (!has_worker_) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void Stream::enqueue(std::function<void()> task) {
  if (!has_worker_) {
    task();
    return;
  }
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
    ++enqueued_;
  }
  changed_.notify_all();
}

void Stream::worker_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and everything enqueued has run
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !first_error_) first_error_ = error;
    ++finished_;
    changed_.notify_all();
  }
}

void Stream::wait_event(const Event& event) {
  enqueue([event] { event.synchronize(); });
}

void Stream::synchronize() {
  if (!has_worker_) return;
  std::unique_lock lock(mutex_);
  const int64_t target = enqueued_;
  changed_.wait(lock, [&] { return finished_ >= target; });
  if (first_error_) {
    auto error = std::exchange(first_error_, nullptr);
    std::rethrow_exception(error);
  }
}

Event::Event() : state_(std::make_shared<State>()) {}

void Event::record(Stream& stream) {
  {
    std::lock_guard lock(state_->mutex);
    state_->completed = false;
  }
  auto state = state_;
  stream.enqueue([state] {
    {
      std::lock_guard lock(state->mutex);
      state->completed = true;
    }
    state->completed_cv.notify_all();
  });
}

bool Event::query() const {
  std::lock_guard lock(state_->mutex);
  return state_->completed;
}

void Event::synchronize() const {
  std::unique_lock lock(state_->mutex);
  state_->completed_cv.wait(lock, [&] { return state_->completed; });
}

}  // namespace tessera
