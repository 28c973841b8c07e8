// Device tensors staged into host memory without blocking the host: cpu
// tensors in page-locked memory, and copies into and out of them enqueued on
// a stream whose completion is an Event. An asynchronous checkpoint snapshot is made
// of these; ops::to and ops::copy_ remain the blocking way across devices.
#pragma once

#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace tessera {

// A dense cpu tensor of `sizes` and `dtype`, page-locked (cudaHostAlloc) when
// the build has a cuda runtime, so a device can copy into it asynchronously;
// ordinary memory otherwise.
Tensor pinned_empty(const Shape& sizes, DType dtype);

// Enqueues host = device on `stream` (a stream of device's device) and
// returns at once; the returned Event completes when `host` holds the bytes,
// and only then may the host read them. `host` is a dense cpu tensor (best
// pinned_empty), `device` a dense cuda tensor of the same dtype and numel.
// The caller orders `stream` after the writes of `device` (Stream::wait_event)
// and the next writes of `device` after the Event.
Event copy_to_host_async(const Tensor& host, const Tensor& device, Stream& stream);

// Enqueues device = host on `stream` (a stream of device's device) and
// returns at once, the way back: `host` a dense cpu tensor (pinned_empty:
// from pageable memory a GPU stages the copy and the host waits for it),
// `device` a dense cuda tensor of the same dtype and numel. The returned
// Event completes once the copy has read `host`; the host must not write
// `host` before it (the host bytes are kept alive until then).
Event copy_from_host_async(const Tensor& device, const Tensor& host, Stream& stream);

// The host is about to read (writes: or write) the cpu tensor `host`, which
// the copies above may use. On the simulator the stream-ordering checker
// throws, naming `operation` and the copy, unless every such copy that wrote
// it (for a write: touched it) is known complete to the host; elsewhere it
// checks nothing.
void check_host_access(const Tensor& host, bool writes, const char* operation);

}  // namespace tessera
