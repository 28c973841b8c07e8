// The optimizer step on the device: fused multi-tensor AdamW (f32/f64 master
// weights and moments, optional bf16 working copy), and clip_grad_norm_'s
// f64 sum of squares and scale, which reads the total on the device so the
// host never waits between the two. Every launch carries up to
// kTensorsPerLaunch tensors by value; block b takes chunk b of the batch.
#include "tensor/cuda/optimizer.h"

#include "tensor/cuda/kernel_loop.h"
#include "tensor/element_conversion.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

namespace {

// Which tensor of a batch owns each block's chunk: tensor t owns chunks
// [first_chunk[t], first_chunk[t + 1]). Empty tensors never enter a batch.
struct ChunkMap {
  int32_t tensors = 0;
  int32_t first_chunk[kTensorsPerLaunch + 1] = {};
  int64_t count[kTensorsPerLaunch] = {};

  __device__ int tensor_of(int32_t chunk) const { return last_at_or_before(first_chunk, tensors, chunk); }
};

template <typename T>
struct AdamWBatch {
  ChunkMap map;
  T* param[kTensorsPerLaunch];
  const T* grad[kTensorsPerLaunch];
  T* exp_avg[kTensorsPerLaunch];
  T* exp_avg_sq[kTensorsPerLaunch];
  BFloat16* working_copy[kTensorsPerLaunch];
  T decay[kTensorsPerLaunch];
  T step_size[kTensorsPerLaunch];
  T inv_sqrt_bias2[kTensorsPerLaunch];
};

template <typename T>
struct DenseBatch {
  ChunkMap map;
  T* data[kTensorsPerLaunch];
};

// The operation order of cpu::adamw_step (tensor/cpu/optimizer.cpp); with no
// contraction into FMAs (-fmad=false) and IEEE sqrt and division, the bits.
template <typename T>
__global__ void __launch_bounds__(kThreads) adamw_kernel(AdamWBatch<T> batch, T beta1, T beta2, T one_minus_beta1,
                                                        T one_minus_beta2, T eps) {
  const int32_t chunk = static_cast<int32_t>(blockIdx.x);
  const int t = batch.map.tensor_of(chunk);
  const int64_t begin = static_cast<int64_t>(chunk - batch.map.first_chunk[t]) * kChunkElements;
  const int64_t end = begin + kChunkElements < batch.map.count[t] ? begin + kChunkElements : batch.map.count[t];
  T* param = batch.param[t];
  const T* grad = batch.grad[t];
  T* exp_avg = batch.exp_avg[t];
  T* exp_avg_sq = batch.exp_avg_sq[t];
  BFloat16* working = batch.working_copy[t];
  const T decay = batch.decay[t], step_size = batch.step_size[t], inv_sqrt_bias2 = batch.inv_sqrt_bias2[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const T g = grad[i];
    const T m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const T v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    // sqrt's result in T, whichever overload the compiler picks (the f64
    // root of an f32 rounds to the f32 root: 53 >= 2 * 24 + 2 bits).
    const T root = static_cast<T>(sqrt(v));
    // The step first, then the decayed parameter: the same two IEEE operands
    // of the subtraction, and fewer values live across f64's division call.
    const T update = step_size * m / (root * inv_sqrt_bias2 + eps);
    const T p = param[i] * decay - update;
    param[i] = p;
    if (working != nullptr) working[i] = convert<BFloat16>(p);
  }
}

// partials[chunk] = f64 sum of squares of the chunk: each thread strides
// over it, then a fixed tree in shared memory.
template <typename T>
__global__ void __launch_bounds__(kThreads) squares_kernel(DenseBatch<T> batch, double* partials) {
  __shared__ double sums[kThreads];
  const int32_t chunk = static_cast<int32_t>(blockIdx.x);
  const int t = batch.map.tensor_of(chunk);
  const int64_t begin = static_cast<int64_t>(chunk - batch.map.first_chunk[t]) * kChunkElements;
  const int64_t end = begin + kChunkElements < batch.map.count[t] ? begin + kChunkElements : batch.map.count[t];
  const T* data = batch.data[t];
  double sum = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double value = static_cast<double>(data[i]);
    sum += value * value;
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[chunk] = sums[0];
}

// One block: thread j sums partials j, j + kThreads, ... in order, then the
// same fixed tree.
__global__ void __launch_bounds__(kThreads) total_kernel(const double* partials, int64_t count, double* total) {
  __shared__ double sums[kThreads];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) total[0] = sums[0];
}

// torch's rule, decided once per block from the total on the device.
template <typename T>
__global__ void __launch_bounds__(kThreads) scale_kernel(DenseBatch<T> batch, const double* total, double max_norm) {
  __shared__ double coefficient;
  if (threadIdx.x == 0) {
    const double norm = sqrt(total[0]);
    coefficient = max_norm / (norm + 1e-6);
    if (!(norm - norm == 0.0) || !(coefficient < 1.0)) coefficient = 1.0;  // non-finite norm: leave the grads
  }
  __syncthreads();
  if (coefficient == 1.0) return;
  const T factor = static_cast<T>(coefficient);
  const int32_t chunk = static_cast<int32_t>(blockIdx.x);
  const int t = batch.map.tensor_of(chunk);
  const int64_t begin = static_cast<int64_t>(chunk - batch.map.first_chunk[t]) * kChunkElements;
  const int64_t end = begin + kChunkElements < batch.map.count[t] ? begin + kChunkElements : batch.map.count[t];
  T* data = batch.data[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) data[i] = data[i] * factor;
}

// Splits `count` tensors into batches: consecutive non-empty tensors of one
// dtype, at most kTensorsPerLaunch each. Calls launch(first, last) for each
// batch's range [first, last) of indices, which starts with a non-empty
// tensor (empty ones inside are skipped by the caller).
template <typename CountOf, typename DTypeOf, typename Launch>
void for_each_batch(size_t count, CountOf count_of, DTypeOf dtype_of_tensor, Launch launch) {
  size_t first = 0;
  while (first < count) {
    if (count_of(first) == 0) {
      ++first;
      continue;
    }
    size_t last = first;
    int members = 0;
    while (last < count && members < kTensorsPerLaunch &&
           (count_of(last) == 0 || dtype_of_tensor(last) == dtype_of_tensor(first))) {
      if (count_of(last) > 0) ++members;
      ++last;
    }
    launch(first, last);
    first = last;
  }
}

LaunchConfig chunk_config(int32_t chunks, std::vector<BufferUse> buffers, Stream* stream) {
  LaunchConfig config;
  config.grid = dim3(static_cast<unsigned>(chunks));
  config.block = dim3(kThreads);
  config.buffers = std::move(buffers);
  config.stream = stream;
  return config;
}

// Adds tensor `count` to a map; returns its chunks.
int32_t add_to_map(ChunkMap& map, int64_t count) {
  const int32_t chunks = static_cast<int32_t>(chunks_of(count));
  map.count[map.tensors] = count;
  map.first_chunk[map.tensors + 1] = map.first_chunk[map.tensors] + chunks;
  ++map.tensors;
  return chunks;
}

template <typename Fn>
void visit_float(DType dtype, const char* kernel, Fn&& fn) {
  if (dtype == DType::f32) return fn(float{});
  if (dtype == DType::f64) return fn(double{});
  refuse_operands(kernel, "computes in f32 or f64, got", dtype);
}

}  // namespace

void adamw_step(const std::vector<AdamWOperands>& tensors, double beta1, double beta2, double eps, Stream* stream) {
  for_each_batch(
      tensors.size(), [&](size_t i) { return tensors[i].count; }, [&](size_t i) { return tensors[i].dtype; },
      [&](size_t first, size_t last) {
        visit_float(tensors[first].dtype, "adamw_step", [&]<typename T>(T) {
          AdamWBatch<T> batch{};
          std::vector<BufferUse> buffers;
          for (size_t i = first; i < last; ++i) {
            const AdamWOperands& tensor = tensors[i];
            if (tensor.count == 0) continue;
            const int slot = batch.map.tensors;
            batch.param[slot] = static_cast<T*>(tensor.param);
            batch.grad[slot] = static_cast<const T*>(tensor.grad);
            batch.exp_avg[slot] = static_cast<T*>(tensor.exp_avg);
            batch.exp_avg_sq[slot] = static_cast<T*>(tensor.exp_avg_sq);
            batch.working_copy[slot] = static_cast<BFloat16*>(tensor.working_copy);
            batch.decay[slot] = static_cast<T>(tensor.decay);
            batch.step_size[slot] = static_cast<T>(tensor.step_size);
            batch.inv_sqrt_bias2[slot] = static_cast<T>(tensor.inv_sqrt_bias2);
            add_to_map(batch.map, tensor.count);
            buffers.insert(buffers.end(), tensor.buffers.begin(), tensor.buffers.end());
          }
          TESSERA_LAUNCH(adamw_kernel<T>, chunk_config(batch.map.first_chunk[batch.map.tensors], buffers, stream),
                         batch, static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(1.0 - beta1),
                         static_cast<T>(1.0 - beta2), static_cast<T>(eps));
        });
      });
}

void sum_of_squares(const std::vector<DenseOperand>& tensors, double* partials, const BufferUse& partials_buffer,
                    double* total, const BufferUse& total_buffer, Stream* stream) {
  int64_t chunks_before = 0;  // partials written by earlier batches
  for_each_batch(
      tensors.size(), [&](size_t i) { return tensors[i].count; }, [&](size_t i) { return tensors[i].dtype; },
      [&](size_t first, size_t last) {
        visit_float(tensors[first].dtype, "sum_of_squares", [&]<typename T>(T) {
          DenseBatch<T> batch{};
          std::vector<BufferUse> buffers = {partials_buffer};
          for (size_t i = first; i < last; ++i) {
            if (tensors[i].count == 0) continue;
            batch.data[batch.map.tensors] = static_cast<T*>(tensors[i].data);
            add_to_map(batch.map, tensors[i].count);
            buffers.push_back(tensors[i].buffer);
          }
          const int32_t chunks = batch.map.first_chunk[batch.map.tensors];
          TESSERA_LAUNCH(squares_kernel<T>, chunk_config(chunks, buffers, stream), batch, partials + chunks_before);
          chunks_before += chunks;
        });
      });
  TESSERA_LAUNCH(total_kernel, chunk_config(1, {partials_buffer, total_buffer}, stream),
                 static_cast<const double*>(partials), chunks_before, total);
}

void scale_to_max_norm(const std::vector<DenseOperand>& tensors, const double* total, const BufferUse& total_buffer,
                       double max_norm, Stream* stream) {
  for_each_batch(
      tensors.size(), [&](size_t i) { return tensors[i].count; }, [&](size_t i) { return tensors[i].dtype; },
      [&](size_t first, size_t last) {
        visit_float(tensors[first].dtype, "scale_to_max_norm", [&]<typename T>(T) {
          DenseBatch<T> batch{};
          std::vector<BufferUse> buffers = {total_buffer};
          for (size_t i = first; i < last; ++i) {
            if (tensors[i].count == 0) continue;
            batch.data[batch.map.tensors] = static_cast<T*>(tensors[i].data);
            add_to_map(batch.map, tensors[i].count);
            buffers.push_back(tensors[i].buffer);
          }
          TESSERA_LAUNCH(scale_kernel<T>, chunk_config(batch.map.first_chunk[batch.map.tensors], buffers, stream),
                         batch, total, max_norm);
        });
      });
}

}  // namespace tessera::cuda
