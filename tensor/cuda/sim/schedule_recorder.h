// The simulated devices' schedules: while a ScheduleRecording lives, every
// operation the host gives a simulated stream is written down per device, in
// the order the host gave it, with what the simulator counted when the stream
// ran it: kernels' bytes and FLOPs, cuBLASLt's shapes, copies' and
// collectives' sizes, and the event records, event waits and host waits that
// order the streams. A timing model replays it (bench/step_schedule.h): the
// order and the dependencies come from the code that really ran, only the
// durations from a model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {
class Stream;
class EventRecord;
}  // namespace tessera

namespace tessera::cuda::sim {

struct ScheduledOp {
  enum class Kind {
    kernel,      // a kernel launch
    gemm,        // a cuBLASLt matmul
    copy,        // a memcpy: name says which way
    collective,  // one rank's part of a device collective
    record,      // an event record: `event` is its id
    wait,        // the stream waits for record `event`
    host_wait,   // the host blocks until record `event` is reached (a stream or event synchronize)
  };
  Kind kind = Kind::kernel;
  int stream = -1;    // the stream's index on its device, in the order of first use; -1 for host_wait
  std::string name;   // kernel, "cublasLtMatmul", "memcpy host to device", "all_gather_into", ...
  int64_t event = -1;
  // Counted when the stream ran it: kernels and GEMMs.
  int64_t device_bytes = 0, shared_bytes = 0, flops = 0;
  // GEMMs: D[m, n] = A[m, k] B[k, n], `batch` times.
  int64_t m = 0, n = 0, k = 0, batch = 1;
  // Copies: the bytes; collectives: the bytes of the whole buffer (an
  // all-gather's output, a reduce-scatter's input, an all-reduce's tensor).
  int64_t bytes = 0;
  int ranks = 0;       // collectives: the group's size
  std::string group = {};  // collectives: the group's name (a mesh dim's, or "world")
};

// Records while it lives; one at a time in a process.
class ScheduleRecording {
 public:
  ScheduleRecording();
  ~ScheduleRecording();
  ScheduleRecording(const ScheduleRecording&) = delete;
  ScheduleRecording& operator=(const ScheduleRecording&) = delete;

  // Device `index`'s operations so far, in the order the host gave them.
  // Synchronize its streams first, or ops still queued have no counts yet.
  std::vector<ScheduledOp> device(int index) const;
};

// The simulator's hooks. Each returns the op's number for counters filled in
// later, or -1 when nothing is recording (then they cost one atomic load).
int64_t schedule_op(const Stream& stream, ScheduledOp op);
void schedule_counts(int64_t op, int64_t device_bytes, int64_t shared_bytes, int64_t flops);
void schedule_record(const Stream& stream, const std::shared_ptr<EventRecord>& record);
void schedule_wait(const Stream& stream, const std::shared_ptr<EventRecord>& record);
// The host blocks until `record` is reached (cudaEventSynchronize), or until
// everything `stream` has been given is done (cudaStreamSynchronize).
void schedule_host_wait(const EventRecord* record);
void schedule_stream_synchronize(const Stream& stream);

}  // namespace tessera::cuda::sim
