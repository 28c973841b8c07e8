// Host entry points of the optimizer kernels (tensor/cuda/optimizer.cu):
// multi-tensor launches in the style of apex's multi_tensor_apply. Up to
// kTensorsPerLaunch tensors travel in one by-value kernel argument; each
// block takes one chunk of kChunkElements of one tensor, found by a binary
// search over the tensors' first chunks. A step over a model is one launch
// per kTensorsPerLaunch tensors of a dtype, never one per parameter.
#pragma once

#include <vector>

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

constexpr int kTensorsPerLaunch = 40;
constexpr int64_t kChunkElements = 2048;

// Chunks of a tensor of `count` elements.
inline int64_t chunks_of(int64_t count) { return (count + kChunkElements - 1) / kChunkElements; }

// One tensor of an AdamW launch (see AdamWTensor in tensor/kernels.h):
// param, grad, exp_avg, exp_avg_sq of `dtype` (f32 or f64), working_copy
// bf16 or null, the host's f64 scalars, and the buffers it touches.
struct AdamWOperands {
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* working_copy = nullptr;
  DType dtype = DType::f32;
  int64_t count = 0;
  double decay = 1.0, step_size = 0.0, inv_sqrt_bias2 = 1.0;
  std::vector<BufferUse> buffers;
};

// One tensor of a sum of squares or a scale: contiguous f32 or f64.
struct DenseOperand {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t count = 0;
  BufferUse buffer;
};

// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p = p * decay - step_size * m / (sqrt(v) * inv_sqrt_bias2 + eps), in the
// tensor's dtype with the cpu's operation order, and the bf16 copy of p.
void adamw_step(const std::vector<AdamWOperands>& tensors, double beta1, double beta2, double eps, Stream* stream);

// total[0] = sum of squares of every element, in f64: each chunk (in the
// order of `tensors`, kChunkElements each) into partials[chunk] by a fixed
// tree, then the partials by one block in a fixed order. partials holds
// sum of chunks_of(count) doubles.
void sum_of_squares(const std::vector<DenseOperand>& tensors, double* partials, const BufferUse& partials_buffer,
                    double* total, const BufferUse& total_buffer, Stream* stream);

// Every tensor *= max_norm / (sqrt(total[0]) + 1e-6) when that is < 1 and
// the norm is finite; each block reads total on the device.
void scale_to_max_norm(const std::vector<DenseOperand>& tensors, const double* total, const BufferUse& total_buffer,
                       double max_norm, Stream* stream);

}  // namespace tessera::cuda
