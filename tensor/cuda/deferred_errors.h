// Errors a kernel finds in its input (an index out of range), reported to the
// host without a synchronisation. A kernel cannot throw, and having the host
// wait for a verdict after every launch would serialise it with the device;
// so, as CUDA's device-side assertions do, the first bad value is written
// to a record the stream owns, in memory both sides address, and the host
// raises it as a tessera::Error the next time it synchronises with that
// stream to read device memory (every read of a value from a cuda tensor).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace tessera {
class Stream;
}

namespace tessera::cuda {

// What a kernel writes; `raised` is claimed with atomicCAS, so the first
// finder's values stand.
struct DeviceErrorRecord {
  unsigned long long raised;
  int64_t check;  // the id register_check returned
  int64_t position;
  int64_t value;
};

// Says what was wrong: the message for the value at `position`.
using DescribeBadValue = std::function<std::string(int64_t position, int64_t value)>;

// The record of `stream`, made on first use.
DeviceErrorRecord* error_record(Stream& stream);
// An id for a check queued on `stream`, kept until the host has seen the
// stream pass it.
int64_t register_check(Stream& stream, DescribeBadValue describe);
// Call once `stream` has been synchronised: throws the first error its kernels
// recorded since the last call, and forgets the checks that have passed.
void raise_deferred_errors(Stream& stream);

}  // namespace tessera::cuda
