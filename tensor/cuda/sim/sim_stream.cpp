#include "tensor/cuda/sim/sim_stream.h"

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "tensor/cuda/runtime.h"
#include "tensor/cuda/sim/schedule_recorder.h"
#include "tensor/cuda/sim/stream_order_checker.h"
#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

std::atomic<uint64_t> jitter_seed{0};
std::atomic<int> jitter_max_microseconds{0};
std::atomic<int64_t> synchronizations{0};
std::atomic<int64_t> host_functions{0};

// The simulated stream whose host function this thread is running, if any,
// and how many RuntimeCalls are open on this thread.
thread_local const SimStream* running_host_function = nullptr;
thread_local int open_runtime_calls = 0;
// Set while a stream's worker waits for another stream's record: a device-side
// wait (cudaStreamWaitEvent), not the host blocking.
thread_local bool device_side_wait = false;

class DeviceSideWait {
 public:
  DeviceSideWait() { device_side_wait = true; }
  ~DeviceSideWait() { device_side_wait = false; }
  DeviceSideWait(const DeviceSideWait&) = delete;
  DeviceSideWait& operator=(const DeviceSideWait&) = delete;
};

// Marks the calling worker thread as inside `stream`'s host function.
class HostFunctionScope {
 public:
  explicit HostFunctionScope(const SimStream& stream) : previous_(running_host_function) {
    running_host_function = &stream;
  }
  ~HostFunctionScope() { running_host_function = previous_; }
  HostFunctionScope(const HostFunctionScope&) = delete;
  HostFunctionScope& operator=(const HostFunctionScope&) = delete;

 private:
  const SimStream* previous_;
};

// Each simulated device's clock in microseconds (sim_stream.h), for the process.
std::atomic<int64_t>& device_clock_us(int device) {
  static std::mutex mutex;
  static auto* clocks = new std::map<int, std::atomic<int64_t>>;  // never destroyed: streams may outlive statics
  std::lock_guard lock(mutex);
  return (*clocks)[device];
}

}  // namespace

// A record that also carries the recording stream's ordering clock, which
// the host learns once it sees the record reached.
class SimStream::Record final : public WorkerStream::Record {
 public:
  Record(bool timing, StreamOrderChecker::Clock ordering_clock)
      : WorkerStream::Record(timing), ordering_clock_(std::move(ordering_clock)) {}

  const StreamOrderChecker::Clock& ordering_clock() const { return ordering_clock_; }
  bool reached() override {
    check_not_in_host_function("cudaEventQuery");
    return WorkerStream::Record::reached();
  }
  void wait_until_reached() override {
    check_not_in_host_function("cudaEventSynchronize");
    if (!device_side_wait) schedule_host_wait(this);
    WorkerStream::Record::wait_until_reached();
  }
  void observed_by_host() override { StreamOrderChecker::instance().host_learns(ordering_clock_); }

 private:
  const StreamOrderChecker::Clock ordering_clock_;
};

RuntimeCall::RuntimeCall(const char* api) {
  check_not_in_host_function(api);
  ++open_runtime_calls;
}

RuntimeCall::~RuntimeCall() { --open_runtime_calls; }

void check_not_in_host_function(const char* api) {
  if (running_host_function == nullptr) return;
  fail("cuda sim: {} inside a host function (a task enqueued with Stream::enqueue) running on {} stream {}: CUDA "
       "permits no CUDA call there and the GPU answers cudaErrorNotPermitted; make the call from the host, before or "
       "after the task, in stream order",
       api, running_host_function->device().str(), running_host_function->checker_id());
}

int64_t host_functions_enqueued() { return host_functions.load(); }

void set_stream_jitter(uint64_t seed, int max_microseconds) {
  jitter_seed.store(seed);
  jitter_max_microseconds.store(max_microseconds);
}

std::shared_ptr<Stream> SimStream::create(Device device, int priority) {
  check_device_index(device.index);
  StreamOrderChecker& checker = StreamOrderChecker::instance();
  const int id = checker.add_stream(device.str());
  return std::make_shared<SimStream>(device, priority, id);
}

SimStream::SimStream(Device device, int priority, int checker_id)
    : WorkerStream(device, priority, true),
      checker_id_(checker_id),
      jitter_random_(jitter_seed.load() * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(checker_id)),
      device_clock_us_(device_clock_us(device.index)) {}

SimStream::~SimStream() { stop_worker(); }

void SimStream::enqueue(std::function<void()> task) {
  const bool host_function = open_runtime_calls == 0;
  if (host_function) {
    check_not_in_host_function("cudaLaunchHostFunc");
    host_functions.fetch_add(1, std::memory_order_relaxed);
  }
  push_task([this, host_function, task = std::move(task)] {
    device_clock_us_.fetch_add(kMicrosecondsPerOperation, std::memory_order_relaxed);
    if (!host_function) {
      task();
      return;
    }
    const HostFunctionScope scope(*this);
    task();
  });
}

void SimStream::wait_event(const Event& event) {
  check_not_in_host_function("cudaStreamWaitEvent");
  const std::shared_ptr<EventRecord> record = event.latest_record();
  if (record) {  // as WorkerStream::wait_event, marked as the device's wait
    push_task([record] {
      const DeviceSideWait scope;
      record->wait_until_reached();
    });
  }
  schedule_wait(*this, record);
  if (const auto* recorded_here = dynamic_cast<const Record*>(record.get())) {
    StreamOrderChecker::instance().stream_waits(checker_id_, recorded_here->ordering_clock());
  }
}

int64_t stream_synchronizations() { return synchronizations.load(); }

void SimStream::synchronize() {
  check_not_in_host_function("cudaStreamSynchronize");
  synchronizations.fetch_add(1, std::memory_order_relaxed);
  schedule_stream_synchronize(*this);
  const StreamOrderChecker::Clock clock = StreamOrderChecker::instance().clock_of(checker_id_);
  // A synchronize that reports an operation's error has still waited for
  // everything: the host learns the clock either way, or a buffer the stream
  // was done with (a staging block) would stay unordered for its next user.
  try {
    WorkerStream::synchronize();
  } catch (...) {
    StreamOrderChecker::instance().host_learns(clock);
    throw;
  }
  StreamOrderChecker::instance().host_learns(clock);
}

bool SimStream::query() {
  check_not_in_host_function("cudaStreamQuery");
  const StreamOrderChecker::Clock clock = StreamOrderChecker::instance().clock_of(checker_id_);
  if (!WorkerStream::query()) return false;
  StreamOrderChecker::instance().host_learns(clock);
  return true;
}

std::shared_ptr<EventRecord> SimStream::record_event(bool timing) {
  check_not_in_host_function("cudaEventRecord");
  auto record = std::make_shared<Record>(timing, StreamOrderChecker::instance().clock_of(checker_id_));
  complete_in_order(record);
  schedule_record(*this, record);
  return record;
}

double SimStream::clock_ms() {
  return static_cast<double>(device_clock_us_.load(std::memory_order_relaxed)) / 1000.0;
}

void SimStream::before_task() {
  const int max_microseconds = jitter_max_microseconds.load();
  if (max_microseconds <= 0) return;
  std::uniform_int_distribution<int> delay(0, max_microseconds);
  std::this_thread::sleep_for(std::chrono::microseconds(delay(jitter_random_)));
}

}  // namespace tessera::cuda::sim
