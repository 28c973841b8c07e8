// Copies between host and cuda tensors, through pinned staging buffers on
// the destination's (or source's) current cuda stream: the only way bytes
// cross between host memory and device memory.
#pragma once

#include "tensor/tensor.h"

namespace tessera::cuda {

// dst (cuda) = src (cpu), with ops::copy_'s rules: src broadcasts to dst,
// dtypes convert, any strides. Returns once the bytes are staged; the copy
// runs on the stream.
void copy_host_to_device(const Tensor& dst, const Tensor& src);
// dst (cpu) = src (cuda); waits for the stream.
void copy_device_to_host(const Tensor& dst, const Tensor& src);

}  // namespace tessera::cuda
