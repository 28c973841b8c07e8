#include "tensor/cuda/nvidia/nvidia_stream.h"

#include "tensor/cuda/nvidia/nvidia_event.h"
#include "tensor/error.h"

namespace tessera::cuda::nvidia {

void check(cudaError_t status, const char* what) {
  TESSERA_CHECK(status == cudaSuccess, "{}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status));
}

// A stream belongs to the device current at its creation: make it on
// `device`, then give the thread back its own.
std::shared_ptr<Stream> NvidiaStream::create(Device device, int priority) {
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  check(cudaSetDevice(device.index), "cudaSetDevice");
  int least = 0, greatest = 0;
  cudaError_t status = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  cudaStream_t stream = nullptr;
  if (status == cudaSuccess) {
    const int clamped = std::min(least, std::max(greatest, priority));
    status = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, clamped);
  }
  if (current != device.index) cudaSetDevice(current);
  check(status, "cudaStreamCreateWithPriority");
  return std::make_shared<NvidiaStream>(device, priority, stream);
}

NvidiaStream::NvidiaStream(Device device, int priority, cudaStream_t stream)
    : Stream(device, priority), stream_(stream) {}

NvidiaStream::~NvidiaStream() {
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

void NvidiaStream::enqueue(std::function<void()> task) {
  auto* owned = new std::function<void()>(std::move(task));
  check(cudaLaunchHostFunc(
            stream_,
            [](void* data) {
              std::unique_ptr<std::function<void()>> run(static_cast<std::function<void()>*>(data));
              (*run)();
            },
            owned),
        "cudaLaunchHostFunc");
}

void NvidiaStream::wait_event(const Event& event) {
  const std::shared_ptr<EventRecord> record = event.latest_record();
  if (!record) return;
  if (const auto* native = dynamic_cast<const NvidiaEventRecord*>(record.get())) {
    check(cudaStreamWaitEvent(stream_, native->native(), 0), "cudaStreamWaitEvent");
    return;
  }
  // An event of a cpu stream: the GPU cannot wait on it, so a host function
  // holds the stream until it is reached (it makes no CUDA call).
  enqueue([record] { record->wait_until_reached(); });
}

void NvidiaStream::synchronize() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

bool NvidiaStream::query() {
  const cudaError_t status = cudaStreamQuery(stream_);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaStreamQuery");
  return true;
}

std::shared_ptr<EventRecord> NvidiaStream::record_event(bool timing) {
  return std::make_shared<NvidiaEventRecord>(device().index, timing, stream_);
}

}  // namespace tessera::cuda::nvidia
