// Kernels for the simulator suite (tests/cuda/test_simulator.cpp): plain CUDA
// C++ through tensor/cuda/portability.h, compiled for the simulator with its
// instrumentation. The broken ones each hold the one bug a test expects the
// simulator to name.
#include "tests/cuda/simulator_kernels.h"

#include "tensor/cuda/portability.h"
#include "tensor/error.h"
#include "tests/cuda/test_launch.h"

using tessera::cuda::BufferAccess;
using tessera::cuda::LaunchConfig;
using tessera::testing::buffer;
using tessera::testing::config;
using tessera::testing::finish;

namespace simulator_kernels {

namespace {

__global__ void block_sums_kernel(const float* in, float* out) {
  float* partial = dynamic_shared_memory<float>();
  const unsigned t = threadIdx.x;
  partial[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

__global__ void warp_sums_kernel(const float* in, float* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  float value = in[i];
  for (int delta = 16; delta > 0; delta /= 2) value += __shfl_down_sync(0xffffffffu, value, delta);
  if (threadIdx.x % 32 == 0) out[i / 32] = value;
}

__global__ void warp_shuffles_kernel(const int* in, int* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const int value = in[i];
  const int rotated = __shfl_sync(0xffffffffu, value, (threadIdx.x + 1) % 32);
  const int up = __shfl_up_sync(0xffffffffu, value, 1);
  const int swapped = __shfl_xor_sync(0xffffffffu, value, 1, 16);
  out[3 * i] = rotated;
  out[3 * i + 1] = up;
  out[3 * i + 2] = swapped;
}

__global__ void warp_votes_kernel(const int* in, unsigned* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const int positive = in[i] > 0;
  const unsigned ballot = __ballot_sync(0xffffffffu, positive);
  const int any = __any_sync(0xffffffffu, positive);
  const int all = __all_sync(0xffffffffu, positive);
  if (threadIdx.x % 32 == 0) {
    out[3 * (i / 32)] = ballot;
    out[3 * (i / 32) + 1] = static_cast<unsigned>(any);
    out[3 * (i / 32) + 2] = static_cast<unsigned>(all);
  }
}

__global__ void histogram_kernel(const int* in, int n, int* counts, float* total) {
  __shared__ int local[16];
  const unsigned t = threadIdx.x;
  if (t < 16) local[t] = 0;
  __syncthreads();
  const int i = static_cast<int>(blockIdx.x * blockDim.x + t);
  if (i < n) {
    atomicAdd(&local[in[i]], 1);
    atomicAdd(total, static_cast<float>(in[i]));
  }
  __syncthreads();
  if (t < 16) atomicAdd(&counts[t], local[t]);
}

__global__ void reverse_kernel(const float* in, float* out, int n) {
  float* staged = dynamic_shared_memory<float>();
  const int t = static_cast<int>(threadIdx.x);
  staged[t] = in[t];
  __syncthreads();
  out[t] = staged[n - 1 - t];
}

__global__ void block_order_kernel(int* out, int* counter) {
  if (threadIdx.x == 0) out[atomicAdd(counter, 1)] = static_cast<int>(blockIdx.x);
}

__global__ void coordinates_kernel(int* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned i = block * blockDim.x * blockDim.y * blockDim.z + thread;
  out[i] = static_cast<int>(i);
}

__global__ void race_on_shared_kernel(float* out) {
  __shared__ float word;
  if (threadIdx.x < 2) word = static_cast<float>(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) out[0] = word;
}

__global__ void reduction_missing_barrier_kernel(const float* in, float* out) {
  float* partial = dynamic_shared_memory<float>();
  const unsigned t = threadIdx.x;
  partial[t] = in[t];
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];  // the barrier after this line is missing
  }
  if (t == 0) out[0] = partial[0];
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
    out[threadIdx.x] = 1.0f;
  }
}

__global__ void barriers_at_two_sites_kernel(float* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

__global__ void write_past_end_kernel(float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i <= n) out[i] = 1.0f;  // should be i < n
}

__global__ void read_undeclared_kernel(const float* declared, const float* undeclared, float* out) {
  out[threadIdx.x] = declared[threadIdx.x] + undeclared[threadIdx.x];
}

__global__ void write_read_only_kernel(float* in) { in[threadIdx.x] = 0.0f; }

__global__ void shared_overflow_kernel(float* out, int count) {
  float* staged = dynamic_shared_memory<float>();
  staged[threadIdx.x + count] = 1.0f;  // one block of `count` floats, written from index `count` on
  out[threadIdx.x] = 0.0f;
}

__global__ void shuffle_mask_mismatch_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  const unsigned mask = lane < 16 ? 0xffffffffu : 0xffff0000u;
  out[lane] = __shfl_sync(mask, lane, 0);
}

__global__ void shuffle_exited_lane_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  if (lane >= 16) {
    __syncthreads();
    return;
  }
  out[lane] = __shfl_sync(0xffffffffu, lane, 0);
}

__global__ void syncwarp_orders_lanes_kernel(int* out) {
  __shared__ int slots[32];
  const int lane = static_cast<int>(threadIdx.x);
  slots[lane] = lane * 10;
  __syncwarp();
  const int neighbour = slots[(lane + 1) % 32];
  __syncwarp();
  slots[lane] = neighbour + 1;
  __syncwarp();
  out[lane] = slots[(lane + 31) % 32];
}

__global__ void fill_kernel(float* out) { out[threadIdx.y * blockDim.x + threadIdx.x] = 1.0f; }

}  // namespace

void block_sums(const float* in, float* out, int blocks, int threads) {
  LaunchConfig launch = config(dim3(blocks), dim3(threads), int64_t{threads} * 4);
  launch.buffers = {buffer("in", in, int64_t{blocks} * threads, BufferAccess::read),
                    buffer("out", out, blocks, BufferAccess::write)};
  TESSERA_LAUNCH(block_sums_kernel, launch, in, out);
  finish(launch);
}

void warp_sums(const float* in, float* out, int warps) {
  TESSERA_CHECK(warps % 4 == 0, "warp_sums: {} warps, not blocks of 4", warps);
  LaunchConfig launch = config(dim3(warps / 4), dim3(128));
  launch.buffers = {buffer("in", in, int64_t{warps} * 32, BufferAccess::read),
                    buffer("out", out, warps, BufferAccess::write)};
  TESSERA_LAUNCH(warp_sums_kernel, launch, in, out);
  finish(launch);
}

void warp_shuffles(const int* in, int* out, int warps) {
  LaunchConfig launch = config(dim3(warps), dim3(32));
  launch.buffers = {buffer("in", in, int64_t{warps} * 32, BufferAccess::read),
                    buffer("out", out, int64_t{warps} * 96, BufferAccess::write)};
  TESSERA_LAUNCH(warp_shuffles_kernel, launch, in, out);
  finish(launch);
}

void warp_votes(const int* in, unsigned* out, int warps) {
  LaunchConfig launch = config(dim3(1), dim3(32 * warps));
  launch.buffers = {buffer("in", in, int64_t{warps} * 32, BufferAccess::read),
                    buffer("out", out, int64_t{warps} * 3, BufferAccess::write)};
  TESSERA_LAUNCH(warp_votes_kernel, launch, in, out);
  finish(launch);
}

void histogram(const int* in, int n, int* counts, int bins, float* total) {
  LaunchConfig launch = config(dim3((n + 63) / 64), dim3(64));
  launch.buffers = {buffer("in", in, n, BufferAccess::read), buffer("counts", counts, bins, BufferAccess::read_write),
                    buffer("total", total, 1, BufferAccess::read_write)};
  TESSERA_LAUNCH(histogram_kernel, launch, in, n, counts, total);
  finish(launch);
}

void reverse_in_shared(const float* in, float* out, int n, tessera::Stream* stream) {
  LaunchConfig launch = config(dim3(1), dim3(n), int64_t{n} * 4);
  launch.buffers = {buffer("in", in, n, BufferAccess::read), buffer("out", out, n, BufferAccess::write)};
  if (stream != nullptr) launch.stream = stream;
  TESSERA_LAUNCH(reverse_kernel, launch, in, out, n);
  if (stream == nullptr) finish(launch);
}

void block_order(int* out, int* counter, int blocks) {
  LaunchConfig launch = config(dim3(blocks), dim3(32));
  launch.buffers = {buffer("out", out, blocks, BufferAccess::write),
                    buffer("counter", counter, 1, BufferAccess::read_write)};
  TESSERA_LAUNCH(block_order_kernel, launch, out, counter);
  finish(launch);
}

void coordinates(int* out, int grid_x, int grid_y, int grid_z, int block_x, int block_y, int block_z) {
  LaunchConfig launch = config(dim3(grid_x, grid_y, grid_z), dim3(block_x, block_y, block_z));
  const int64_t count = int64_t{grid_x} * grid_y * grid_z * block_x * block_y * block_z;
  launch.buffers = {buffer("out", out, count, BufferAccess::write)};
  TESSERA_LAUNCH(coordinates_kernel, launch, out);
  finish(launch);
}

void race_on_shared(float* out) {
  LaunchConfig launch = config(dim3(1), dim3(64));
  launch.buffers = {buffer("out", out, 1, BufferAccess::write)};
  TESSERA_LAUNCH(race_on_shared_kernel, launch, out);
  finish(launch);
}

void reduction_missing_barrier(const float* in, float* out, int threads) {
  LaunchConfig launch = config(dim3(1), dim3(threads), int64_t{threads} * 4);
  launch.buffers = {buffer("in", in, threads, BufferAccess::read), buffer("out", out, 1, BufferAccess::write)};
  TESSERA_LAUNCH(reduction_missing_barrier_kernel, launch, in, out);
  finish(launch);
}

void divergent_barrier(float* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(divergent_barrier_kernel, launch, out);
  finish(launch);
}

void barriers_at_two_sites(float* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(barriers_at_two_sites_kernel, launch, out);
  finish(launch);
}

void write_past_end(float* out, int n, tessera::Stream* stream) {
  LaunchConfig launch = config(dim3((n + 64) / 64), dim3(64));
  if (stream != nullptr) launch.stream = stream;
  launch.buffers = {buffer("out", out, n, BufferAccess::write)};
  TESSERA_LAUNCH(write_past_end_kernel, launch, out, n);
  if (stream == nullptr) finish(launch);
}

void read_undeclared(const float* declared, const float* undeclared, float* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("declared", declared, 32, BufferAccess::read), buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(read_undeclared_kernel, launch, declared, undeclared, out);
  finish(launch);
}

void write_read_only(float* in) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("in", in, 32, BufferAccess::read)};
  TESSERA_LAUNCH(write_read_only_kernel, launch, in);
  finish(launch);
}

void shared_overflow(float* out, int dynamic_bytes) {
  LaunchConfig launch = config(dim3(1), dim3(32), dynamic_bytes);
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(shared_overflow_kernel, launch, out, dynamic_bytes / 4);
  finish(launch);
}

void shuffle_mask_mismatch(int* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(shuffle_mask_mismatch_kernel, launch, out);
  finish(launch);
}

void shuffle_exited_lane(int* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(shuffle_exited_lane_kernel, launch, out);
  finish(launch);
}

void syncwarp_orders_lanes(int* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(syncwarp_orders_lanes_kernel, launch, out);
  finish(launch);
}

void too_many_threads(float* out) {
  LaunchConfig launch = config(dim3(1), dim3(32, 33));
  launch.buffers = {buffer("out", out, 32 * 33, BufferAccess::write)};
  TESSERA_LAUNCH(fill_kernel, launch, out);
  finish(launch);
}

void too_much_shared(float* out, bool opt_in) {
  LaunchConfig launch = config(dim3(1), dim3(32), 64 * 1024);
  launch.shared_memory_opt_in = opt_in;
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(fill_kernel, launch, out);
  finish(launch);
}

// float4 loads, the toolkit's bf16 and f16 conversions, and their operators
// and intrinsics, as a kernel would use them.
__global__ void sixteen_bit_floats_kernel(const float4* in, __nv_bfloat16* bf16_out, __half* half_out, int quads) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= quads) return;
  const float4 v = in[i];
  const __nv_bfloat16 bx = __float2bfloat16(v.x), by = __float2bfloat16(v.y);
  bf16_out[3 * i] = bx;
  bf16_out[3 * i + 1] = bx * by;
  bf16_out[3 * i + 2] = __hneg(by);
  const __half hz = __float2half(v.z), hw = __float2half(v.w);
  const __half2 pair = __halves2half2(hz, hw);
  half_out[3 * i] = hz;
  half_out[3 * i + 1] = __hmul(hz, hw);
  half_out[3 * i + 2] = __high2half(pair);
}

void sixteen_bit_floats(const float* in, __nv_bfloat16* bf16_out, __half* half_out, int quads) {
  LaunchConfig launch = config(dim3((quads + 127) / 128), dim3(128));
  launch.buffers = {buffer("in", in, 4 * quads, BufferAccess::read),
                    buffer("bf16_out", bf16_out, 3 * quads, BufferAccess::write),
                    buffer("half_out", half_out, 3 * quads, BufferAccess::write)};
  TESSERA_LAUNCH(sixteen_bit_floats_kernel, launch, reinterpret_cast<const float4*>(in), bf16_out, half_out, quads);
  finish(launch);
}

// Each block stages `floats` floats of a static __shared__ array (48 KiB
// plus 1 KiB declared) next to `dynamic_bytes` of dynamic shared memory.
__global__ void static_shared_kernel(float* out, int floats) {
  __shared__ float staged[12288 + 256];
  for (int i = threadIdx.x; i < floats; i += blockDim.x) staged[i] = static_cast<float>(i);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = staged[floats - 1];
}

void static_shared(float* out, int floats, int dynamic_bytes, bool opt_in) {
  LaunchConfig launch = config(dim3(2), dim3(256), dynamic_bytes);
  launch.shared_memory_opt_in = opt_in;
  launch.buffers = {buffer("out", out, 2, BufferAccess::write)};
  TESSERA_LAUNCH(static_shared_kernel, launch, out, floats);
  finish(launch);
}

}  // namespace simulator_kernels
