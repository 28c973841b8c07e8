#include "tensor/cuda/nvidia/nvidia_stream.h"

#include "tensor/error.h"

namespace tessera::cuda::nvidia {

void check(cudaError_t status, const char* what) {
  TESSERA_CHECK(status == cudaSuccess, "{}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status));
}

std::shared_ptr<Stream> NvidiaStream::create(Device device, int priority) {
  check(cudaSetDevice(device.index), "cudaSetDevice");
  int least = 0, greatest = 0;
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  const int clamped = std::min(least, std::max(greatest, priority));
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, clamped), "cudaStreamCreateWithPriority");
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
  std::shared_ptr<void> native;
  {
    std::lock_guard lock(event.state()->mutex);
    native = event.state()->native_event;
  }
  if (native) check(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(native.get()), 0), "cudaStreamWaitEvent");
}

void NvidiaStream::synchronize() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

bool NvidiaStream::query() {
  const cudaError_t status = cudaStreamQuery(stream_);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaStreamQuery");
  return true;
}

void NvidiaStream::record(const std::shared_ptr<EventState>& event) {
  cudaEvent_t native = nullptr;
  check(cudaEventCreateWithFlags(&native, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaEventRecord(native, stream_), "cudaEventRecord");
  {
    std::lock_guard lock(event->mutex);
    event->completed = false;
    event->recorded = true;
    event->native_event = std::shared_ptr<void>(native, [](void* pointer) {
      cudaEventDestroy(static_cast<cudaEvent_t>(pointer));
    });
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

}  // namespace tessera::cuda::nvidia
