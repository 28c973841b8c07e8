// Events on the nvidia runtime. Each Event::record takes a cudaEvent_t from
// a per-device pool and calls cudaEventRecord; Event::query and synchronize
// are cudaEventQuery and cudaEventSynchronize, elapsed_ms is
// cudaEventElapsedTime. No host callback is enqueued, and a pooled event is
// created once (cudaEventDisableTiming unless timing is asked for), reused
// for the life of the process and never destroyed: dropping the last copy
// of an Event, wherever that happens, makes no CUDA call.
#pragma once

#include <cuda_runtime.h>

#include "tensor/stream.h"

namespace tessera::cuda::nvidia {

class NvidiaEventRecord final : public EventRecord {
 public:
  // Takes a pooled event of `device` and records it on `stream`.
  NvidiaEventRecord(int device, bool timing, cudaStream_t stream);
  // Gives the event back to the pool (no CUDA call).
  ~NvidiaEventRecord() override;

  cudaEvent_t native() const { return event_; }
  bool reached() override;
  void wait_until_reached() override;
  double elapsed_ms_until(EventRecord& end) override;

 private:
  int device_;
  cudaEvent_t event_;
};

}  // namespace tessera::cuda::nvidia
