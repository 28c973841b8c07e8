#include "tensor/cuda/deferred_errors.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/stream.h"

namespace tessera::cuda {

namespace {

struct StreamChecks {
  DeviceErrorRecord* record = nullptr;
  std::map<int64_t, DescribeBadValue> pending;  // checks queued and not yet seen to pass
};

std::mutex checks_mutex;
int64_t next_check = 1;

// Keyed by stream identity; a stream's entry lives as long as the process
// (records are a few bytes, and streams are few).
std::map<const Stream*, StreamChecks>& checks_by_stream() {
  static auto* checks = new std::map<const Stream*, StreamChecks>();
  return *checks;
}

StreamChecks& checks_of(const Stream& stream) {
  StreamChecks& checks = checks_by_stream()[&stream];
  if (checks.record == nullptr) {
    checks.record = static_cast<DeviceErrorRecord*>(mapped_host_malloc(sizeof(DeviceErrorRecord)));
    std::memset(checks.record, 0, sizeof(DeviceErrorRecord));
  }
  return checks;
}

}  // namespace

DeviceErrorRecord* error_record(Stream& stream) {
  std::lock_guard lock(checks_mutex);
  return checks_of(stream).record;
}

int64_t register_check(Stream& stream, DescribeBadValue describe) {
  std::lock_guard lock(checks_mutex);
  const int64_t id = next_check++;
  checks_of(stream).pending.emplace(id, std::move(describe));
  return id;
}

void raise_deferred_errors(Stream& stream) {
  std::string message;
  {
    std::lock_guard lock(checks_mutex);
    auto found = checks_by_stream().find(&stream);
    if (found == checks_by_stream().end()) return;
    StreamChecks& checks = found->second;
    DeviceErrorRecord& record = *checks.record;
    if (record.raised != 0) {
      const auto check = checks.pending.find(record.check);
      message = check != checks.pending.end()
                    ? check->second(record.position, record.value)
                    : "a kernel found a bad value (index " + std::to_string(record.value) + " at position " +
                          std::to_string(record.position) + ")";
      std::memset(&record, 0, sizeof(record));
    }
    checks.pending.clear();  // the stream has run everything queued so far
  }
  TESSERA_CHECK(message.empty(), "{} (found on {} by a kernel; reported at this read of the device, the first "
                "synchronisation after it)", message, stream.device().str());
}

}  // namespace tessera::cuda
