// A cuda stream on the nvidia runtime: a cudaStream_t created non-blocking
// (it never synchronises with the legacy default stream) at the requested
// priority. Events are pooled cudaEvent_ts (nvidia_event.h), recorded and
// waited on with no host callback; only a user's Stream::enqueue task runs
// through cudaLaunchHostFunc.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "tensor/stream.h"

namespace tessera::cuda::nvidia {

class NvidiaStream final : public Stream {
 public:
  static std::shared_ptr<Stream> create(Device device, int priority);
  NvidiaStream(Device device, int priority, cudaStream_t stream);
  ~NvidiaStream() override;

  cudaStream_t native() const { return stream_; }
  void enqueue(std::function<void()> task) override;
  void wait_event(const Event& event) override;
  void synchronize() override;
  bool query() override;
  std::shared_ptr<EventRecord> record_event(bool timing) override;

 private:
  cudaStream_t stream_;
};

// Throws tessera::Error "<what>: <CUDA's message>" unless `status` is cudaSuccess.
void check(cudaError_t status, const char* what);

}  // namespace tessera::cuda::nvidia
