// Copies between host and cuda tensors, through pinned staging buffers on
// the destination's (or source's) current cuda stream: the only way bytes
// cross between host memory and device memory.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace tessera::cuda {

// dst (cuda) = src (cpu), with ops::copy_'s rules: src broadcasts to dst,
// dtypes convert, any strides. Returns once the bytes are staged; the copy
// runs on the stream.
void copy_host_to_device(const Tensor& dst, const Tensor& src);
// dst (cpu) = src (cuda); waits for the stream.
void copy_device_to_host(const Tensor& dst, const Tensor& src);

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
