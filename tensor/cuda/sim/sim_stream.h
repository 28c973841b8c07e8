// A simulated cuda stream: a worker thread that runs its work in order,
// asynchronously to the host (WorkerStream), and keeps the stream-ordering
// checker's clocks: record() stamps the event with this stream's clock,
// wait_event() merges it, synchronize() and a completed query() tell the
// host. Jitter mode delays each operation by a seeded random time, so tests
// shake out orderings that only timing was providing.
#pragma once

#include <cstdint>
#include <memory>
#include <random>

#include "tensor/stream.h"

namespace tessera::cuda::sim {

class SimStream final : public WorkerStream {
 public:
  static std::shared_ptr<Stream> create(Device device, int priority);
  SimStream(Device device, int priority, int checker_id);
  ~SimStream() override;

  // The stream's id in the StreamOrderChecker.
  int checker_id() const { return checker_id_; }

  void wait_event(const Event& event) override;
  void synchronize() override;
  bool query() override;
  void record(const std::shared_ptr<EventState>& event) override;

 protected:
  void before_task() override;

 private:
  int checker_id_;
  std::mt19937_64 jitter_random_;
};

// Jitter mode: every operation on a simulated stream first sleeps a random
// 0..max_microseconds, drawn from (seed, stream). 0 turns it off.
void set_stream_jitter(uint64_t seed, int max_microseconds);

// How many times the host has called synchronize() on a simulated stream
// since the process started: tests hold code that must not wait for the
// device (an asynchronous checkpoint snapshot) to a count of zero.
int64_t stream_synchronizations();

}  // namespace tessera::cuda::sim
