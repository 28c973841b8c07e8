// The stream-ordering checker. Every kernel and copy on a simulated stream
// declares the device bytes it reads and writes. An access on stream B to
// bytes last written (or, for a write, read) on stream A is an error unless
// B waited on an event recorded on A after that access, or the host
// synchronized with A (or saw such an event complete) before enqueuing on B.
// Freeing and reusing memory follows the same rule, because the state of the
// bytes outlives the tensor that used them. Vector clocks per stream and for
// the host; per byte range, the last write and the latest read per stream.
// This is the instrument the FSDP-on-GPU work is proven with.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/cuda/launch_config.h"

namespace tessera::cuda::sim {

class StreamOrderChecker {
 public:
  using Clock = std::vector<uint64_t>;

  static StreamOrderChecker& instance();

  // A new stream's id; it appears in messages as "<device> stream <id>".
  int add_stream(const std::string& device);
  // Checks an operation enqueued on `stream` (on the host, before it runs)
  // against every earlier access to its buffers and records it. Throws
  // tessera::Error naming both operations, the buffer, both streams and the fix.
  void check_and_record(int stream, const std::string& operation, const std::vector<BufferUse>& buffers);
  // The clock of everything enqueued on `stream` so far.
  Clock clock_of(int stream);
  // wait_event: later work on `stream` is ordered after `clock`.
  void stream_waits(int stream, const Clock& clock);
  // The host knows everything in `clock` has run (a synchronize, or an
  // event seen complete): work it enqueues from now on is ordered after it.
  void host_learns(const Clock& clock);
  // Checks a read or write of host memory by the host itself against the
  // copies on streams that touched it (memcpy_async records its host side):
  // each must be known to the host (host_learns). Throws tessera::Error
  // naming both operations and the stream. Nothing is recorded: whatever the
  // host enqueues later is ordered after its own accesses.
  void check_host_access(const std::string& operation, const std::vector<BufferUse>& buffers);
  // cudaFree synchronizes the device: freed memory starts with no history.
  void forget(const void* begin, int64_t bytes);

 private:
  struct Access {
    int stream = -1;
    uint64_t tick = 0;
    std::string operation;
    std::string buffer;
  };
  struct Range {
    uintptr_t end = 0;
    Access last_write;
    std::vector<Access> reads;  // the latest per stream since the last write
  };

  // Makes a range boundary at `address` (splitting the range across it).
  void split_at(uintptr_t address);
  // The ranges covering [begin, end), creating empty ones over the gaps.
  std::vector<Range*> cover(uintptr_t begin, uintptr_t end);
  bool ordered(const Clock& clock, const Access& earlier, int stream) const;
  [[noreturn]] void fail_unordered(int stream, const std::string& operation, const BufferUse& buffer,
                                   const char* what, const Access& earlier) const;
  [[noreturn]] void fail_host_unordered(const std::string& operation, const BufferUse& buffer, const char* what,
                                        const Access& earlier) const;

  std::mutex mutex_;
  std::vector<std::string> names_;
  std::vector<Clock> clocks_;
  Clock host_;
  std::map<uintptr_t, Range> ranges_;  // begin -> range, disjoint
};

}  // namespace tessera::cuda::sim
