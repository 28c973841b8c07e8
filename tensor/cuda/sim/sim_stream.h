// A simulated cuda stream: a worker thread that runs its work in order,
// asynchronously to the host (WorkerStream), and keeps the stream-ordering
// checker's clocks: record_event() stamps the record with this stream's
// clock, wait_event() merges it, synchronize() and a completed query() tell
// the host. Jitter mode delays each operation by a seeded random time, so
// tests shake out orderings that only timing was providing.
//
// It also enforces CUDA's rule for host functions: a task a user enqueues
// (Stream::enqueue, cudaLaunchHostFunc on a GPU) may make no CUDA call, so
// every simulated CUDA call (a launch, a copy, a device malloc or free, an
// event or stream call) made from inside one is a tessera::Error naming the
// call, where the hardware answers cudaErrorNotPermitted. The simulator's
// own work on the worker (kernels, copies, cuBLASLt calls, event records
// and waits) is device work, not a host function.
#pragma once

#include <atomic>
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

  // Inside a RuntimeCall: the call's device work. Otherwise a host function.
  void enqueue(std::function<void()> task) override;
  void wait_event(const Event& event) override;
  void synchronize() override;
  bool query() override;
  std::shared_ptr<EventRecord> record_event(bool timing) override;

 protected:
  void before_task() override;
  double clock_ms() override;

 private:
  class Record;

  int checker_id_;
  std::mt19937_64 jitter_random_;
  std::atomic<int64_t>& device_clock_us_;
};

// A simulated CUDA call in progress on this thread. Made inside a host
// function it throws (check_not_in_host_function); while it lives, what
// this thread enqueues on a simulated stream is the call's device work.
// One line at the start of each entry point: `const RuntimeCall call("cudaMemcpyAsync");`.
class RuntimeCall {
 public:
  explicit RuntimeCall(const char* api);
  ~RuntimeCall();
  RuntimeCall(const RuntimeCall&) = delete;
  RuntimeCall& operator=(const RuntimeCall&) = delete;
};

// Throws tessera::Error naming `api` (e.g. "cudaMalloc") if this thread is
// running a host function of a simulated stream.
void check_not_in_host_function(const char* api);

// Host functions enqueued on simulated streams since the process started:
// tests hold tessera's own work (kernels, copies, frees, event records) to
// making none, as each is a host callback that can stall a GPU's stream.
int64_t host_functions_enqueued();

// Jitter mode: every operation on a simulated stream first sleeps a random
// 0..max_microseconds, drawn from (seed, stream). 0 turns it off.
void set_stream_jitter(uint64_t seed, int max_microseconds);

// How many times the host has called synchronize() on a simulated stream
// since the process started: tests hold code that must not wait for the
// device (an asynchronous checkpoint snapshot) to a count of zero.
int64_t stream_synchronizations();

// The simulated device clock, which timing events read (Event::elapsed_ms):
// it stands still except that each operation a simulated stream of the
// device runs (a kernel, a copy, a cuBLASLt call, a host function) advances
// it by kMicrosecondsPerOperation when it runs. Elapsed time between two
// events is therefore the number of operations the device ran between them,
// in simulated microseconds: deterministic for the work of one stream (work
// of concurrent streams counts in the order their workers ran it). It says
// nothing about how long a GPU would take.
constexpr int64_t kMicrosecondsPerOperation = 1;

}  // namespace tessera::cuda::sim
