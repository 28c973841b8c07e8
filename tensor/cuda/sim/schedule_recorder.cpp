#include "tensor/cuda/sim/schedule_recorder.h"

#include <atomic>
#include <map>
#include <mutex>

#include "tensor/error.h"
#include "tensor/stream.h"

namespace tessera::cuda::sim {

namespace {

struct DeviceSchedule {
  std::vector<ScheduledOp> ops;
  std::map<const Stream*, int> streams;  // index in first-use order
  int64_t next_event = 0;                // events are numbered per device: its ranks' order does not change them
};

// Ops are numbered across devices: number = device * kOpsPerDevice + index.
constexpr int64_t kOpsPerDevice = int64_t{1} << 40;

struct Recorder {
  std::mutex mutex;
  std::map<int, DeviceSchedule> devices;
  // Records are kept alive while recording, so an address names one record.
  struct KnownRecord {
    int64_t event;
    int device;
    std::shared_ptr<EventRecord> alive;
  };
  std::map<const EventRecord*, KnownRecord> records;

  int stream_index(DeviceSchedule& device, const Stream& stream) {
    return device.streams.try_emplace(&stream, static_cast<int>(device.streams.size())).first->second;
  }
  int64_t event_id(const std::shared_ptr<EventRecord>& record, int device) {
    int64_t& next_event = devices[device].next_event;
    auto [it, added] = records.try_emplace(record.get(), KnownRecord{next_event, device, record});
    if (added) ++next_event;
    return it->second.event;
  }
  int64_t append(int device, ScheduledOp op) {
    DeviceSchedule& schedule = devices[device];
    schedule.ops.push_back(std::move(op));
    return device * kOpsPerDevice + static_cast<int64_t>(schedule.ops.size()) - 1;
  }
  // An op on `stream`, which gets the stream's index on its device.
  int64_t append_on(const Stream& stream, ScheduledOp op) {
    const int device = stream.device().index;
    op.stream = stream_index(devices[device], stream);
    return append(device, std::move(op));
  }
};

// Set and cleared under the recorder's mutex. Hooks read it first without
// the mutex to skip it when nothing records, then again under it.
std::atomic<bool> recording{false};
Recorder* const recorder = new Recorder;  // never destroyed: streams may outlive statics

bool still_recording() { return recording.load(std::memory_order_relaxed); }

}  // namespace

ScheduleRecording::ScheduleRecording() {
  std::lock_guard lock(recorder->mutex);
  TESSERA_CHECK(!still_recording(), "cuda sim: a ScheduleRecording is already recording; one at a time");
  recording.store(true, std::memory_order_release);
}

ScheduleRecording::~ScheduleRecording() {
  std::lock_guard lock(recorder->mutex);
  recording.store(false, std::memory_order_release);
  recorder->devices.clear();
  recorder->records.clear();
}

std::vector<ScheduledOp> ScheduleRecording::device(int index) const {
  std::lock_guard lock(recorder->mutex);
  const auto it = recorder->devices.find(index);
  return it == recorder->devices.end() ? std::vector<ScheduledOp>{} : it->second.ops;
}

int64_t schedule_op(const Stream& stream, ScheduledOp op) {
  if (!recording.load(std::memory_order_acquire)) return -1;
  std::lock_guard lock(recorder->mutex);
  if (!still_recording()) return -1;
  return recorder->append_on(stream, std::move(op));
}

void schedule_counts(int64_t op, int64_t device_bytes, int64_t shared_bytes, int64_t flops) {
  if (op < 0 || !recording.load(std::memory_order_acquire)) return;
  std::lock_guard lock(recorder->mutex);
  if (!still_recording()) return;
  const auto device = recorder->devices.find(static_cast<int>(op / kOpsPerDevice));
  if (device == recorder->devices.end()) return;
  ScheduledOp& counted = device->second.ops.at(static_cast<size_t>(op % kOpsPerDevice));
  counted.device_bytes += device_bytes;
  counted.shared_bytes += shared_bytes;
  counted.flops += flops;
}

void schedule_record(const Stream& stream, const std::shared_ptr<EventRecord>& record) {
  if (!recording.load(std::memory_order_acquire)) return;
  std::lock_guard lock(recorder->mutex);
  if (!still_recording()) return;
  const int64_t event = recorder->event_id(record, stream.device().index);
  recorder->append_on(stream, {.kind = ScheduledOp::Kind::record, .name = "event record", .event = event});
}

void schedule_wait(const Stream& stream, const std::shared_ptr<EventRecord>& record) {
  if (record == nullptr || !recording.load(std::memory_order_acquire)) return;
  std::lock_guard lock(recorder->mutex);
  if (!still_recording()) return;
  const auto known = recorder->records.find(record.get());
  if (known == recorder->records.end()) return;  // recorded before the recording began: already reached
  recorder->append_on(stream, {.kind = ScheduledOp::Kind::wait, .name = "event wait", .event = known->second.event});
}

void schedule_host_wait(const EventRecord* record) {
  if (!recording.load(std::memory_order_acquire)) return;
  std::lock_guard lock(recorder->mutex);
  if (!still_recording()) return;
  const auto known = recorder->records.find(record);
  if (known == recorder->records.end()) return;
  const int64_t event = known->second.event;
  const int device = known->second.device;
  recorder->append(device, ScheduledOp{.kind = ScheduledOp::Kind::host_wait, .name = "host wait", .event = event});
}

void schedule_stream_synchronize(const Stream& stream) {
  if (!recording.load(std::memory_order_acquire)) return;
  std::lock_guard lock(recorder->mutex);
  if (!still_recording()) return;
  // The host waits for an implicit record at the stream's end.
  const int device = stream.device().index;
  const int64_t event = recorder->devices[device].next_event++;
  recorder->append_on(stream, {.kind = ScheduledOp::Kind::record, .name = "stream synchronize", .event = event});
  recorder->append(device, {.kind = ScheduledOp::Kind::host_wait, .name = "host wait", .event = event});
}

}  // namespace tessera::cuda::sim
