// Kernels bench/simulator times: one of each shape of work the simulator
// does (a thread per element with no barrier, a block tree with barriers, a
// warp-shuffle reduction), compiled for the simulator like every .cu file.
#include "bench/simulator_kernels.h"

#include "tensor/cuda/portability.h"
#include "tensor/stream.h"

using tessera::cuda::BufferAccess;
using tessera::cuda::BufferUse;
using tessera::cuda::LaunchConfig;

namespace simulator_bench {

namespace {

__global__ void scale_kernel(const float* in, float* out, int n, float factor) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] * factor;
}

__global__ void block_tree_sum_kernel(const float* in, float* out) {
  __shared__ float partial[256];
  const unsigned t = threadIdx.x;
  partial[t] = in[blockIdx.x * 256 + t];
  __syncthreads();
  for (unsigned stride = 128; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

__global__ void warp_shuffle_sum_kernel(const float* in, float* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  float value = in[i];
  for (int delta = 16; delta > 0; delta /= 2) value += __shfl_down_sync(0xffffffffu, value, delta);
  if (threadIdx.x % 32 == 0) out[i / 32] = value;
}

LaunchConfig config(int blocks, int threads, std::vector<BufferUse> buffers) {
  LaunchConfig launch;
  launch.grid = dim3(blocks);
  launch.block = dim3(threads);
  launch.buffers = std::move(buffers);
  launch.stream = tessera::current_stream(tessera::Device(tessera::DeviceType::cuda)).get();
  return launch;
}

}  // namespace

void scale(const float* in, float* out, int n) {
  const int64_t bytes = int64_t{n} * 4;
  LaunchConfig launch = config((n + 255) / 256, 256, {{"in", in, bytes, BufferAccess::read},
                                                     {"out", out, bytes, BufferAccess::write}});
  TESSERA_LAUNCH(scale_kernel, launch, in, out, n, 2.0f);
  launch.stream->synchronize();
}

void block_tree_sum(const float* in, float* out, int blocks) {
  LaunchConfig launch = config(blocks, 256, {{"in", in, int64_t{blocks} * 256 * 4, BufferAccess::read},
                                             {"out", out, int64_t{blocks} * 4, BufferAccess::write}});
  TESSERA_LAUNCH(block_tree_sum_kernel, launch, in, out);
  launch.stream->synchronize();
}

void warp_shuffle_sum(const float* in, float* out, int warps) {
  LaunchConfig launch = config(warps / 8, 256, {{"in", in, int64_t{warps} * 32 * 4, BufferAccess::read},
                                                {"out", out, int64_t{warps} * 4, BufferAccess::write}});
  TESSERA_LAUNCH(warp_shuffle_sum_kernel, launch, in, out);
  launch.stream->synchronize();
}

}  // namespace simulator_bench
