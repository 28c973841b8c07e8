// Streams (worker threads, or inline) and events; the current stream per
// device and thread. A cuda stream comes from the device's runtime
// (tensor/device_runtime.h).
#include "tensor/stream.h"

#include <array>
#include <chrono>
#include <map>
#include <typeinfo>

#include "tensor/device_runtime.h"
#include "tensor/error.h"

namespace tessera {

namespace {

// This thread's current stream per device, and per cuda ordinal.
thread_local std::map<std::pair<int, int>, std::shared_ptr<Stream>> current_streams;

std::pair<int, int> key(Device device) { return {static_cast<int>(device.type), device.index}; }

}  // namespace

std::shared_ptr<Stream> Stream::default_stream(Device device) {
  static const std::array<std::shared_ptr<Stream>, kNumDeviceTypes> inline_streams = {
      std::make_shared<WorkerStream>(kCPU, 0, false),
      nullptr,
      std::make_shared<WorkerStream>(kMeta, 0, false),
  };
  if (!device.is_cuda()) return inline_streams[static_cast<int>(device.type)];
  auto& stream = current_streams[key(device)];
  if (!stream) stream = device_runtime(device).create_stream(device, 0);
  return stream;
}

std::shared_ptr<Stream> Stream::create(Device device, int priority) {
  if (device.is_cuda()) return device_runtime(device).create_stream(device, priority);
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

void WorkerStream::enqueue(std::function<void()> task) { push_task(std::move(task)); }

void WorkerStream::push_task(std::function<void()> task) {
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
  std::shared_ptr<EventRecord> record = event.latest_record();
  if (record) push_task([record] { record->wait_until_reached(); });
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

std::shared_ptr<EventRecord> WorkerStream::record_event(bool timing) {
  auto record = std::make_shared<Record>(timing);
  complete_in_order(record);
  return record;
}

void WorkerStream::complete_in_order(const std::shared_ptr<Record>& record) {
  push_task([this, record] { record->mark_reached(clock_ms()); });
}

double WorkerStream::clock_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool WorkerStream::Record::reached() {
  std::lock_guard lock(mutex_);
  return reached_;
}

void WorkerStream::Record::wait_until_reached() {
  std::unique_lock lock(mutex_);
  reached_cv_.wait(lock, [&] { return reached_; });
}

void WorkerStream::Record::mark_reached(double at_ms) {
  {
    std::lock_guard lock(mutex_);
    reached_ = true;
    reached_at_ms_ = at_ms;
  }
  reached_cv_.notify_all();
}

double WorkerStream::Record::elapsed_ms_until(EventRecord& end) {
  auto* other = dynamic_cast<Record*>(&end);
  TESSERA_CHECK(other != nullptr && typeid(*other) == typeid(*this),
                "Event::elapsed_ms: the two events were recorded on streams of different runtimes, whose clocks "
                "differ");
  const auto reached_at = [](Record& record, const char* which) {
    std::lock_guard lock(record.mutex_);
    TESSERA_CHECK(record.reached_, "Event::elapsed_ms: the {} event has not completed", which);
    return record.reached_at_ms_;
  };
  return reached_at(*other, "end") - reached_at(*this, "start");
}

Event::Event() : Event(false) {}

Event::Event(bool timing) : state_(std::make_shared<State>(timing)) {}

Event Event::timed() { return Event(true); }

bool Event::timing() const { return state_->timing; }

std::shared_ptr<EventRecord> Event::latest_record() const {
  std::lock_guard lock(state_->mutex);
  return state_->latest;
}

void Event::record(Stream& stream) {
  std::shared_ptr<EventRecord> record = stream.record_event(state_->timing);
  std::lock_guard lock(state_->mutex);
  state_->latest = std::move(record);
}

bool Event::query() const {
  const std::shared_ptr<EventRecord> record = latest_record();
  if (!record) return true;
  if (!record->reached()) return false;
  record->observed_by_host();
  return true;
}

void Event::synchronize() const {
  const std::shared_ptr<EventRecord> record = latest_record();
  if (!record) return;
  record->wait_until_reached();
  record->observed_by_host();
}

double Event::elapsed_ms(const Event& end) const {
  const auto timed_record = [](const Event& event, const char* which) {
    TESSERA_CHECK(event.timing(), "Event::elapsed_ms: the {} event was made without timing (use Event::timed())",
                  which);
    std::shared_ptr<EventRecord> record = event.latest_record();
    TESSERA_CHECK(record != nullptr, "Event::elapsed_ms: the {} event was never recorded", which);
    return record;
  };
  const std::shared_ptr<EventRecord> start = timed_record(*this, "start"), stop = timed_record(end, "end");
  return start->elapsed_ms_until(*stop);
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
