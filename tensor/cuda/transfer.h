// Copies between host and cuda tensors, through pinned staging buffers on
// the destination's (or source's) current cuda stream: the only way bytes
// cross between host memory and device memory.
#pragma once

#include <cstdint>

#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace tessera::cuda {

// dst (cuda) = src (cpu), with ops::copy_'s rules: src broadcasts to dst,
// dtypes convert, any strides. Returns once the bytes are staged; the copy
// runs on the stream.
void copy_host_to_device(const Tensor& dst, const Tensor& src);
// dst (cpu) = src (cuda); waits for the stream.
void copy_device_to_host(const Tensor& dst, const Tensor& src);
// dst (cpu, dense, ideally page-locked) = src (cuda, dense, same dtype and
// numel), enqueued on `stream` without waiting: the returned Event completes
// once dst holds the bytes. `stream` must be ordered after src's writes
// (wait_event), and src must not be written until the Event.
Event copy_device_to_host_async(const Tensor& dst, const Tensor& src, Stream& stream);
// dst (cuda, dense) = src (cpu, dense, ideally page-locked; same dtype and
// numel), enqueued on `stream` without waiting: the returned Event completes
// once the copy has read src, and src must not be written before it. `stream`
// must be ordered after dst's earlier uses.
Event copy_host_to_device_async(const Tensor& dst, const Tensor& src, Stream& stream);
// `bytes` of page-locked host memory as a dense cpu tensor (cudaHostAlloc).
Tensor pinned_host_empty(const Shape& sizes, DType dtype);

// Every transfer since the last reset, counted process-wide: a device-to-host
// copy is a synchronisation of the host with the device, so these are what a
// steady training step is held to (one read of the loss and norm per step).
struct TransferStats {
  int64_t host_to_device = 0;
  int64_t device_to_host = 0;
  int64_t bytes_to_device = 0;
  int64_t bytes_to_host = 0;
};
TransferStats transfer_stats();
void reset_transfer_stats();

}  // namespace tessera::cuda
