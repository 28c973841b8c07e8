// Kernels for tests/cuda/test_fidelity.cpp: plain CUDA C++ through
// tensor/cuda/portability.h, written in the idioms the checks are about.
#include "tests/cuda/fidelity_kernels.h"

#include "tensor/cuda/portability.h"
#include "tests/cuda/test_launch.h"

using tessera::cuda::BufferAccess;
using tessera::cuda::BufferUse;
using tessera::cuda::LaunchConfig;
using tessera::cuda::StridedElements;
using tessera::testing::buffer;
using tessera::testing::config;
using tessera::testing::finish;

namespace fidelity_kernels {

namespace {

__global__ void add_one_kernel(const float* in, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] + 1.0f;
}

__global__ void fill_zero_kernel(float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = 0.0f;
}

__global__ void block_totals_kernel(const float* in, float* out, bool zero_first) {
  __shared__ float total;
  if (zero_first && threadIdx.x == 0) total = 0.0f;
  __syncthreads();
  atomicAdd(&total, in[blockIdx.x * blockDim.x + threadIdx.x]);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

__global__ void read_next_staged_kernel(const float* in, float* out, int n, bool stage_sentinel) {
  float* staged = dynamic_shared_memory<float>();
  const int t = static_cast<int>(threadIdx.x);
  staged[t] = in[t];
  if (stage_sentinel && t == 0) staged[n] = 0.0f;
  __syncthreads();
  out[t] = staged[t + 1];
}

__global__ void write_q_view_kernel(float* q, int width, int row_stride) {
  q[blockIdx.x * row_stride + threadIdx.x] = 1.0f;
  (void)width;
}

__global__ void load_float4_kernel(const float4* in, float* out, int n) {
  const int i = static_cast<int>(threadIdx.x);
  if (i >= n) return;
  const float4 v = in[i];
  out[i] = v.x + v.y + v.z + v.w;
}

__global__ void load_bfloat162_kernel(const __nv_bfloat162* in, float* out, int n) {
  const int i = static_cast<int>(threadIdx.x);
  if (i >= n) return;
  const __nv_bfloat162 pair = in[i];
  out[i] = __bfloat162float(pair.x) + __bfloat162float(pair.y);
}

__global__ void swap_halves_kernel(int* out, bool half_masks) {
  __shared__ int slots[32];
  const int lane = static_cast<int>(threadIdx.x);
  slots[lane] = lane;
  if (!half_masks) {
    __syncwarp();
  } else if (lane < 16) {
    __syncwarp(0x0000ffffu);
  } else {
    __syncwarp(0xffff0000u);
  }
  out[lane] = slots[(lane + 16) % 32];
}

__global__ void pass_along_pairs_kernel(int* out) {
  __shared__ int slots[32];
  const int lane = static_cast<int>(threadIdx.x);
  if (lane == 0) slots[0] = 100;
  // Sync k joins lanes k and k + 1: lane 0's store reaches lane 31 through 31 of them.
  for (int k = 0; k < 31; ++k) {
    if (lane == k || lane == k + 1) __syncwarp((1u << k) | (1u << (k + 1)));
  }
  if (lane == 31) out[0] = slots[0];
}

__global__ void ticket_chain_kernel(int* counter, int* out) {
  const int t = static_cast<int>(threadIdx.x);
  volatile int* ticket = counter;
  while (*ticket != t) {
  }
  out[t] = t;
  atomicAdd(counter, 1);
}

__global__ void spin_forever_kernel(int* flag, bool use_atomic) {
  if (threadIdx.x != 0) return;
  if (use_atomic) {
    while (atomicCAS(flag, 1, 1) != 1) {
    }
  } else {
    volatile int* polled = flag;
    while (*polled == 0) {
    }
  }
}

__global__ void shuffle_after_exit_kernel(int* out, bool read_exited) {
  const int lane = static_cast<int>(threadIdx.x);
  if (lane >= 16) return;
  out[lane] = read_exited ? __shfl_down_sync(0xffffffffu, lane, 8) : __shfl_sync(0xffffffffu, lane, 0);
}

__global__ void same_value_flag_kernel(int* out, bool then_race) {
  __shared__ int flag;
  __shared__ int last_writer;
  flag = 1;
  if (then_race) last_writer = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    out[0] = flag;
    out[1] = then_race ? last_writer : -1;
  }
}

}  // namespace

void add_one(const float* in, float* out, int n) {
  LaunchConfig launch = config(dim3((n + 63) / 64), dim3(64));
  launch.buffers = {buffer("in", in, n, BufferAccess::read), buffer("out", out, n, BufferAccess::write)};
  TESSERA_LAUNCH(add_one_kernel, launch, in, out, n);
  finish(launch);
}

void fill_zero(float* out, int n) {
  LaunchConfig launch = config(dim3((n + 63) / 64), dim3(64));
  launch.buffers = {buffer("out", out, n, BufferAccess::write)};
  TESSERA_LAUNCH(fill_zero_kernel, launch, out, n);
  finish(launch);
}

void block_totals(const float* in, float* out, int blocks, bool zero_first) {
  LaunchConfig launch = config(dim3(blocks), dim3(64));
  launch.buffers = {buffer("in", in, int64_t{blocks} * 64, BufferAccess::read),
                    buffer("out", out, blocks, BufferAccess::write)};
  TESSERA_LAUNCH(block_totals_kernel, launch, in, out, zero_first);
  finish(launch);
}

void read_next_staged(const float* in, float* out, int n, bool stage_sentinel) {
  LaunchConfig launch = config(dim3(1), dim3(n), int64_t{n + 1} * 4);
  launch.buffers = {buffer("in", in, n, BufferAccess::read), buffer("out", out, n, BufferAccess::write)};
  TESSERA_LAUNCH(read_next_staged_kernel, launch, in, out, n, stage_sentinel);
  finish(launch);
}

void write_q_view(float* packed, int rows, int width, int row_stride) {
  LaunchConfig launch = config(dim3(rows), dim3(width));
  const int64_t sizes[2] = {rows, width}, strides[2] = {3 * width, 1};
  BufferUse q = buffer("q f32[rows, width] of the packed qkv", packed, int64_t{rows - 1} * 3 * width + width,
                       BufferAccess::write);
  q.elements = StridedElements::of(4, 2, sizes, strides);
  launch.buffers = {q};
  TESSERA_LAUNCH(write_q_view_kernel, launch, packed, width, row_stride);
  finish(launch);
}

void load_float4(const float* in, float* out, int n, int offset_floats) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("in", in, 4 * n + 4, BufferAccess::read), buffer("out", out, n, BufferAccess::write)};
  TESSERA_LAUNCH(load_float4_kernel, launch, reinterpret_cast<const float4*>(in + offset_floats), out, n);
  finish(launch);
}

void load_bfloat162(const __nv_bfloat16* in, float* out, int n, int offset) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("in", in, 2 * n + 2, BufferAccess::read), buffer("out", out, n, BufferAccess::write)};
  TESSERA_LAUNCH(load_bfloat162_kernel, launch, reinterpret_cast<const __nv_bfloat162*>(in + offset), out, n);
  finish(launch);
}

void launch_on_null_stream(float* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  launch.stream = nullptr;
  TESSERA_LAUNCH(fill_zero_kernel, launch, out, 32);
}

void swap_halves(int* out, bool half_masks) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(swap_halves_kernel, launch, out, half_masks);
  finish(launch);
}

void pass_along_pairs(int* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 1, BufferAccess::write)};
  TESSERA_LAUNCH(pass_along_pairs_kernel, launch, out);
  finish(launch);
}

void ticket_chain(int* counter, int* out, int threads) {
  LaunchConfig launch = config(dim3(1), dim3(threads));
  launch.buffers = {buffer("counter", counter, 1, BufferAccess::read_write),
                    buffer("out", out, threads, BufferAccess::write)};
  TESSERA_LAUNCH(ticket_chain_kernel, launch, counter, out);
  finish(launch);
}

void spin_forever(int* flag, bool use_atomic) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("flag", flag, 1, BufferAccess::read_write)};
  TESSERA_LAUNCH(spin_forever_kernel, launch, flag, use_atomic);
  finish(launch);
}

void shuffle_after_exit(int* out, bool read_exited) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 16, BufferAccess::write)};
  TESSERA_LAUNCH(shuffle_after_exit_kernel, launch, out, read_exited);
  finish(launch);
}

void same_value_flag(int* out, bool then_race) {
  LaunchConfig launch = config(dim3(1), dim3(64));
  launch.buffers = {buffer("out", out, 2, BufferAccess::write)};
  TESSERA_LAUNCH(same_value_flag_kernel, launch, out, then_race);
  finish(launch);
}

}  // namespace fidelity_kernels
