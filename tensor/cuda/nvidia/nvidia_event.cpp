// The nvidia runtime's event records and the per-device pool of cudaEvent_ts they take.
#include "tensor/cuda/nvidia/nvidia_event.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "tensor/cuda/nvidia/nvidia_stream.h"
#include "tensor/error.h"

namespace tessera::cuda::nvidia {

namespace {

// Free events by (device, timing).
struct EventPool {
  std::mutex mutex;
  std::map<std::pair<int, bool>, std::vector<cudaEvent_t>> free;
};

EventPool& pool() {
  static auto* instance = new EventPool;  // never destroyed: events may be dropped during static destruction
  return *instance;
}

// A new event on `device` (events belong to the device current at creation).
cudaEvent_t create_event(int device, bool timing) {
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check(cudaSetDevice(device), "cudaSetDevice");
  cudaEvent_t event = nullptr;
  const cudaError_t status = cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming);
  if (current != device) cudaSetDevice(current);
  check(status, "cudaEventCreateWithFlags");
  return event;
}

cudaEvent_t take_event(int device, bool timing) {
  {
    EventPool& p = pool();
    const std::lock_guard lock(p.mutex);
    std::vector<cudaEvent_t>& free = p.free[{device, timing}];
    if (!free.empty()) {
      const cudaEvent_t event = free.back();
      free.pop_back();
      return event;
    }
  }
  return create_event(device, timing);
}

void give_back(int device, bool timing, cudaEvent_t event) {
  EventPool& p = pool();
  const std::lock_guard lock(p.mutex);
  p.free[{device, timing}].push_back(event);
}

}  // namespace

NvidiaEventRecord::NvidiaEventRecord(int device, bool timing, cudaStream_t stream)
    : EventRecord(timing), device_(device), event_(take_event(device, timing)) {
  const cudaError_t status = cudaEventRecord(event_, stream);
  if (status != cudaSuccess) give_back(device_, timing, event_);
  check(status, "cudaEventRecord");
}

NvidiaEventRecord::~NvidiaEventRecord() { give_back(device_, timing(), event_); }

bool NvidiaEventRecord::reached() {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaEventQuery");
  return true;
}

void NvidiaEventRecord::wait_until_reached() { check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

double NvidiaEventRecord::elapsed_ms_until(EventRecord& end) {
  auto* other = dynamic_cast<NvidiaEventRecord*>(&end);
  TESSERA_CHECK(other != nullptr, "Event::elapsed_ms: the end event was not recorded on a cuda stream of this runtime");
  float milliseconds = 0;
  const cudaError_t status = cudaEventElapsedTime(&milliseconds, event_, other->event_);
  TESSERA_CHECK(status != cudaErrorNotReady, "Event::elapsed_ms: an event has not completed");
  check(status, "cudaEventElapsedTime");
  return milliseconds;
}

}  // namespace tessera::cuda::nvidia
