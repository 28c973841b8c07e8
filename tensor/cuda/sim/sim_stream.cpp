#include "tensor/cuda/sim/sim_stream.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "tensor/cuda/sim/stream_order_checker.h"

namespace tessera::cuda::sim {

namespace {

std::atomic<uint64_t> jitter_seed{0};
std::atomic<int> jitter_max_microseconds{0};
std::atomic<int64_t> synchronizations{0};

}  // namespace

void set_stream_jitter(uint64_t seed, int max_microseconds) {
  jitter_seed.store(seed);
  jitter_max_microseconds.store(max_microseconds);
}

std::shared_ptr<Stream> SimStream::create(Device device, int priority) {
  StreamOrderChecker& checker = StreamOrderChecker::instance();
  const int id = checker.add_stream(device.str());
  return std::make_shared<SimStream>(device, priority, id);
}

SimStream::SimStream(Device device, int priority, int checker_id)
    : WorkerStream(device, priority, true),
      checker_id_(checker_id),
      jitter_random_(jitter_seed.load() * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(checker_id)) {}

SimStream::~SimStream() { stop_worker(); }

void SimStream::wait_event(const Event& event) {
  StreamOrderChecker::Clock clock;
  {
    std::lock_guard lock(event.state()->mutex);
    clock = event.state()->ordering_clock;
  }
  WorkerStream::wait_event(event);
  StreamOrderChecker::instance().stream_waits(checker_id_, clock);
}

int64_t stream_synchronizations() { return synchronizations.load(); }

void SimStream::synchronize() {
  synchronizations.fetch_add(1, std::memory_order_relaxed);
  const StreamOrderChecker::Clock clock = StreamOrderChecker::instance().clock_of(checker_id_);
  WorkerStream::synchronize();
  StreamOrderChecker::instance().host_learns(clock);
}

bool SimStream::query() {
  const StreamOrderChecker::Clock clock = StreamOrderChecker::instance().clock_of(checker_id_);
  if (!WorkerStream::query()) return false;
  StreamOrderChecker::instance().host_learns(clock);
  return true;
}

void SimStream::record(const std::shared_ptr<EventState>& event) {
  const StreamOrderChecker::Clock clock = StreamOrderChecker::instance().clock_of(checker_id_);
  {
    std::lock_guard lock(event->mutex);
    event->ordering_clock = clock;
    event->on_host_observed = [clock] { StreamOrderChecker::instance().host_learns(clock); };
  }
  WorkerStream::record(event);
}

void SimStream::before_task() {
  const int max_microseconds = jitter_max_microseconds.load();
  if (max_microseconds <= 0) return;
  std::uniform_int_distribution<int> delay(0, max_microseconds);
  std::this_thread::sleep_for(std::chrono::microseconds(delay(jitter_random_)));
}

}  // namespace tessera::cuda::sim
