// How the attention kernels (attention.cu on CUDA cores, attention_mma.cu on
// tensor cores) address an operand's heads.
#pragma once

#include <cstdint>

#include "tensor/cuda/kernel_operand.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

// An operand's heads: row t of head (b, h) starts at data + b * batch_stride
// + h * head_stride + t * row_stride, its D values contiguous. So q, k and v
// may be views into one packed [B, T, 3C] projection and out may be written
// in the [B, T, H, D] order the heads merge back in, with no copies.
template <typename T>
struct Heads {
  T* data;
  int64_t batch_stride, head_stride, row_stride;

  // The first row of head `index` (b * heads_per_batch + h).
  __device__ T* head(int64_t index, int heads_per_batch) const {
    const int64_t batch = index / heads_per_batch;
    return data + batch * batch_stride + (index - batch * heads_per_batch) * head_stride;
  }
};

// The heads of a [B, H, T, D] operand (the kernel table checked its D stride is 1).
template <typename T>
Heads<T> heads_of(const Operand& operand) {
  const int64_t* strides = operand.layout.strides;
  return {static_cast<T*>(operand.data), strides[0], strides[1], strides[2]};
}

}  // namespace tessera::cuda
