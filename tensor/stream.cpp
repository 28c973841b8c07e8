// Streams (worker threads, or inline) and events; the current stream per
// device and thread.
#include "tensor/stream.h"

#include <array>
#include <map>

#include "tensor/error.h"
#if TESSERA_HAVE_CUDA_SIM
#include "tensor/cuda/sim/sim_stream.h"
#elif TESSERA_HAVE_CUDA_NVIDIA
#include "tensor/cuda/nvidia/nvidia_stream.h"
#endif

namespace tessera {

namespace {

std::shared_ptr<Stream> create_cuda_stream([[maybe_unused]] Device device, [[maybe_unused]] int priority) {
#if TESSERA_HAVE_CUDA_SIM
  return cuda::sim::SimStream::create(device, priority);
#elif TESSERA_HAVE_CUDA_NVIDIA
  return cuda::nvidia::NvidiaStream::create(device, priority);
#else
  fail("Stream: no cuda runtime in this build (configure with the CUDA toolkit for the simulator)");
#endif
}

// This thread's current stream per device, and per cuda ordinal.
thread_local std::map<std::pair<int, int>, std::shared_ptr<Stream>> current_streams;

std::pair<int, int> key(Device device) { return {static_cast<int>(device.type), device.index}; }

void wait_until_completed(EventState& state) {
  std::unique_lock lock(state.mutex);
  state.completed_cv.wait(lock, [&] { return state.completed; });
}

// The host has seen `state` complete: tell whoever asked to know.
void observed_by_host(EventState& state) {
  std::function<void()> observed;
  {
    std::lock_guard lock(state.mutex);
    observed = state.on_host_observed;
  }
  if (observed) observed();
}

}  // namespace

std::shared_ptr<Stream> Stream::default_stream(Device device) {
  static const std::array<std::shared_ptr<Stream>, kNumDeviceTypes> inline_streams = {
      std::make_shared<WorkerStream>(kCPU, 0, false),
      nullptr,
      std::make_shared<WorkerStream>(kMeta, 0, false),
  };
  if (!device.is_cuda()) return inline_streams[static_cast<int>(device.type)];
  auto& stream = current_streams[key(device)];
  if (!stream) stream = create_cuda_stream(device, 0);
  return stream;
}

std::shared_ptr<Stream> Stream::create(Device device, int priority) {
  if (device.is_cuda()) return create_cuda_stream(device, priority);
  return std::make_shared<WorkerStream>(device, priority, true);
}

WorkerStream::WorkerStream(Device device, int priority, bool has_worker)
    : Stream(device, priority), has_worker_(has_worker) {
  if (has_worker_) worker_ = std::thread([this] { worker_loop(); });
}

WorkerStream::~WorkerStream() { stop_worker(); }

void WorkerStream::stop_worker() {
  if (!has_worker_ || !worker_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void WorkerStream::enqueue(std::function<void()> task) {
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

void WorkerStream::worker_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and everything enqueued has run
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      before_task();
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

void WorkerStream::wait_event(const Event& event) {
  enqueue([state = event.state()] { wait_until_completed(*state); });
}

void WorkerStream::synchronize() {
  if (!has_worker_) return;
  std::unique_lock lock(mutex_);
  const int64_t target = enqueued_;
  changed_.wait(lock, [&] { return finished_ >= target; });
  if (first_error_) {
    auto error = std::exchange(first_error_, nullptr);
    std::rethrow_exception(error);
  }
}

bool WorkerStream::query() {
  std::lock_guard lock(mutex_);
  return finished_ >= enqueued_;
}

void WorkerStream::record(const std::shared_ptr<EventState>& event) {
  {
    std::lock_guard lock(event->mutex);
    event->completed = false;
    event->recorded = true;
  }
  enqueue([event] {
    {
      std::lock_guard lock(event->mutex);
      event->completed = true;
      event->completed_at = std::chrono::steady_clock::now();
    }
    event->completed_cv.notify_all();
  });
}

Event::Event() : state_(std::make_shared<EventState>()) {}

void Event::record(Stream& stream) { stream.record(state_); }

bool Event::query() const {
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->completed) return false;
  }
  observed_by_host(*state_);
  return true;
}

void Event::synchronize() const {
  wait_until_completed(*state_);
  observed_by_host(*state_);
}

double Event::elapsed_ms(const Event& end) const {
  const auto completion = [](EventState& state, const char* which) {
    std::lock_guard lock(state.mutex);
    TESSERA_CHECK(state.recorded && state.completed, "Event::elapsed_ms: the {} event {}", which,
                  state.recorded ? "has not completed" : "was never recorded");
    return state.completed_at;
  };
  const auto start = completion(*state_, "start"), stop = completion(*end.state_, "end");
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

std::shared_ptr<Stream> current_stream(Device device) {
  const auto it = current_streams.find(key(device));
  if (it != current_streams.end() && it->second) return it->second;
  return Stream::default_stream(device);
}

StreamGuard::StreamGuard(std::shared_ptr<Stream> stream) : stream_(std::move(stream)) {
  TESSERA_CHECK(stream_ != nullptr, "StreamGuard: null stream");
  auto& slot = current_streams[key(stream_->device())];
  previous_ = slot;
  slot = stream_;
}

StreamGuard::~StreamGuard() { current_streams[key(stream_->device())] = previous_; }

}  // namespace tessera
