// The conformance suite's kernels: CUDA as NVIDIA's programming guide writes
// it, with only the launch in tessera's spelling (TESSERA_LAUNCH).
#include "tests/cuda/conformance_kernels.h"

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include "tensor/cuda/portability.h"
#include "tests/cuda/test_launch.h"

namespace cg = cooperative_groups;
using tessera::cuda::BufferAccess;
using tessera::cuda::LaunchConfig;
using tessera::testing::buffer;
using tessera::testing::config;
using tessera::testing::finish;

namespace conformance_kernels {

namespace {

__global__ void __launch_bounds__(128) row_sums_cooperative_kernel(const float* x, float* out, int cols) {
  __shared__ float warp_sums[32];
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  const float* row = x + static_cast<long long>(blockIdx.x) * cols;
  float sum = 0.0f;
  for (int col = static_cast<int>(block.thread_rank()); col < cols; col += static_cast<int>(block.num_threads())) {
    sum += row[col];
  }
  sum = cg::reduce(warp, sum, cg::plus<float>());
  if (warp.thread_rank() == 0) warp_sums[warp.meta_group_rank()] = sum;
  block.sync();
  if (warp.meta_group_rank() == 0) {
    float total = warp.thread_rank() < warp.meta_group_size() ? warp_sums[warp.thread_rank()] : 0.0f;
    total = cg::reduce(warp, total, cg::plus<float>());
    if (warp.thread_rank() == 0) out[blockIdx.x] = total;
  }
}

// The programming guide's shared-memory tree: a block per row, its partial
// sums in `extern __shared__` storage sized at launch.
__global__ void __launch_bounds__(256) row_sums_extern_shared_kernel(const float* x, float* out, int cols) {
  extern __shared__ float partial[];
  const unsigned t = threadIdx.x;
  float sum = 0.0f;
  for (int col = static_cast<int>(t); col < cols; col += static_cast<int>(blockDim.x)) {
    sum += x[static_cast<long long>(blockIdx.x) * cols + col];
  }
  partial[t] = sum;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) partial[t] += partial[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

__global__ void __launch_bounds__(128) row_max_warp_kernel(const float* x, float* out, int rows, int cols) {
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / warpSize);
  const int lane = static_cast<int>(threadIdx.x % warpSize);
  if (row >= rows) return;  // whole warps leave together
  float best = -INFINITY;
  for (int col = lane; col < cols; col += warpSize) best = fmaxf(best, __ldg(&x[static_cast<long long>(row) * cols + col]));
  for (int offset = warpSize / 2; offset > 0; offset /= 2) best = fmaxf(best, __shfl_down_sync(0xffffffffu, best, offset));
  if (lane == 0) out[row] = best;
}

__global__ void __launch_bounds__(128) softmax_online_kernel(const float* x, float* y, int rows, int cols) {
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / warpSize);
  const int lane = static_cast<int>(threadIdx.x % warpSize);
  if (row >= rows) return;
  const float* in = x + static_cast<long long>(row) * cols;
  // One pass: a running maximum, and the sum rescaled whenever it grows.
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int col = lane; col < cols; col += warpSize) {
    const float value = in[col];
    if (value > running_max) {
      running_sum *= expf(running_max - value);
      running_max = value;
    }
    running_sum += expf(value - running_max);
  }
  for (int offset = warpSize / 2; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(0xffffffffu, running_max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, running_sum, offset);
    const float merged = fmaxf(running_max, other_max);
    running_sum = (running_sum == 0.0f ? 0.0f : running_sum * expf(running_max - merged)) +
                  (other_sum == 0.0f ? 0.0f : other_sum * expf(other_max - merged));
    running_max = merged;
  }
  float* out = y + static_cast<long long>(row) * cols;
  for (int col = lane; col < cols; col += warpSize) out[col] = expf(in[col] - running_max) / running_sum;
}

__global__ void __launch_bounds__(32) layer_norm_vectorized_kernel(const float4* x, const float4* weight, const float4* bias, float4* y,
                                             int quads) {
  const int row = static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x);
  const float4* in = x + static_cast<long long>(row) * quads;
  float sum = 0.0f, squares = 0.0f;
  for (int q = lane; q < quads; q += warpSize) {
    const float4 v = __ldcs(&in[q]);
    sum += (v.x + v.y) + (v.z + v.w);
    squares += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
  }
  for (int offset = warpSize / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  }
  const float count = static_cast<float>(quads * 4);
  const float mean = sum / count;
  const float inv_std = rsqrtf(squares / count - mean * mean + 1e-5f);
  for (int q = lane; q < quads; q += warpSize) {
    const float4 v = __ldcs(&in[q]), w = __ldg(&weight[q]), b = __ldg(&bias[q]);
    float4 out;
    out.x = (v.x - mean) * inv_std * w.x + b.x;
    out.y = (v.y - mean) * inv_std * w.y + b.y;
    out.z = (v.z - mean) * inv_std * w.z + b.z;
    out.w = (v.w - mean) * inv_std * w.w + b.w;
    __stcs(&y[static_cast<long long>(row) * quads + q], out);
  }
}

__global__ void __launch_bounds__(256) integer_builtins_kernel(const unsigned* values, int* out) {
  const int t = static_cast<int>(threadIdx.x);
  const unsigned value = values[t];
  out[t] = __popc(value) * 10000 + __clz(static_cast<int>(value)) * 100 + __ffs(static_cast<int>(value));
  const int odd = static_cast<int>(value & 1u);
  const int odd_in_block = __syncthreads_count(odd);
  const int all_below = __syncthreads_and(value < 1000u);
  const int any_zero = __syncthreads_or(value == 0u);
  const unsigned same_parity = __match_any_sync(0xffffffffu, value & 1u);
  const unsigned warp_sum = __reduce_add_sync(0xffffffffu, value);
  const unsigned warp_max = __reduce_max_sync(0xffffffffu, value);
  const int warp_min_signed = __reduce_min_sync(0xffffffffu, static_cast<int>(value) - 500);
  int all_equal = 0;
  const unsigned equal_mask = __match_all_sync(0xffffffffu, value / 4096u, &all_equal);
  if (t == 0) {
    out[256] = odd_in_block;
    out[257] = all_below;
    out[258] = any_zero;
  }
  if (t % 32 == 0) {
    const int warp = t / 32;
    out[259 + 6 * warp] = static_cast<int>(same_parity);
    out[260 + 6 * warp] = static_cast<int>(warp_sum);
    out[261 + 6 * warp] = static_cast<int>(warp_max);
    out[262 + 6 * warp] = warp_min_signed;
    out[263 + 6 * warp] = static_cast<int>(equal_mask);
    out[264 + 6 * warp] = all_equal;
  }
}

__global__ void __launch_bounds__(256) atomics_kernel(int* ints, unsigned* unsigneds, unsigned long long* wide, long long* signed_wide,
                               float* floats, __nv_bfloat16* bf16s, __half* halves) {
  const int t = static_cast<int>(threadIdx.x);
  atomicAdd(&ints[0], t);
  atomicSub(&ints[1], t);
  atomicMax(&ints[2], t - 7);
  atomicMin(&ints[3], 100 - t);
  atomicAnd(&unsigneds[0], ~(1u << (t % 32)));
  atomicOr(&unsigneds[1], 1u << (t % 32));
  atomicXor(&unsigneds[2], 1u << (t % 8));
  atomicInc(&unsigneds[3], 9u);
  atomicDec(&unsigneds[4], 9u);
  atomicCAS(&unsigneds[5], static_cast<unsigned>(t), static_cast<unsigned>(t + 1));
  atomicAdd(&wide[0], 1ull << 33);
  atomicMax(&wide[1], static_cast<unsigned long long>(t) << 40);
  atomicMin(&signed_wide[0], -static_cast<long long>(t) * (1ll << 35));
  atomicExch(&floats[0], 2.5f);
  atomicAdd(&floats[1], 0.25f);
  atomicAdd(&bf16s[0], __float2bfloat16(1.0f));
  atomicAdd(&halves[0], __float2half(0.5f));
}

__global__ void __launch_bounds__(32) shuffle_bfloat162_kernel(const __nv_bfloat162* in, __nv_bfloat162* out) {
  const int lane = static_cast<int>(threadIdx.x);
  out[lane] = __shfl_sync(0xffffffffu, in[lane], (lane + 1) % 32);
}

__global__ void __launch_bounds__(32) bounded_wait_kernel(int* out) {
  if (threadIdx.x != 0) return;
  const long long start = clock64();
  while (clock64() - start < 100) __nanosleep(32);
  out[0] = 1;
}

}  // namespace

void row_sums_cooperative(const float* x, float* out, int rows, int cols) {
  LaunchConfig launch = config(dim3(rows), dim3(128));
  launch.buffers = {buffer("x", x, int64_t{rows} * cols, BufferAccess::read), buffer("out", out, rows, BufferAccess::write)};
  TESSERA_LAUNCH(row_sums_cooperative_kernel, launch, x, out, cols);
  finish(launch);
}

void row_sums_extern_shared(const float* x, float* out, int rows, int cols) {
  LaunchConfig launch = config(dim3(rows), dim3(256), 256 * sizeof(float));
  launch.buffers = {buffer("x", x, int64_t{rows} * cols, BufferAccess::read), buffer("out", out, rows, BufferAccess::write)};
  TESSERA_LAUNCH(row_sums_extern_shared_kernel, launch, x, out, cols);
  finish(launch);
}

void row_max_warp(const float* x, float* out, int rows, int cols) {
  LaunchConfig launch = config(dim3((rows + 3) / 4), dim3(128));
  launch.buffers = {buffer("x", x, int64_t{rows} * cols, BufferAccess::read), buffer("out", out, rows, BufferAccess::write)};
  TESSERA_LAUNCH(row_max_warp_kernel, launch, x, out, rows, cols);
  finish(launch);
}

void softmax_online(const float* x, float* y, int rows, int cols) {
  LaunchConfig launch = config(dim3((rows + 3) / 4), dim3(128));
  launch.buffers = {buffer("x", x, int64_t{rows} * cols, BufferAccess::read),
                    buffer("y", y, int64_t{rows} * cols, BufferAccess::write)};
  TESSERA_LAUNCH(softmax_online_kernel, launch, x, y, rows, cols);
  finish(launch);
}

void layer_norm_vectorized(const float* x, const float* weight, const float* bias, float* y, int rows, int cols) {
  LaunchConfig launch = config(dim3(rows), dim3(32));
  launch.buffers = {buffer("x", x, int64_t{rows} * cols, BufferAccess::read),
                    buffer("weight", weight, cols, BufferAccess::read), buffer("bias", bias, cols, BufferAccess::read),
                    buffer("y", y, int64_t{rows} * cols, BufferAccess::write)};
  TESSERA_LAUNCH(layer_norm_vectorized_kernel, launch, reinterpret_cast<const float4*>(x),
                 reinterpret_cast<const float4*>(weight), reinterpret_cast<const float4*>(bias),
                 reinterpret_cast<float4*>(y), cols / 4);
  finish(launch);
}

void integer_builtins(const unsigned* values, int* out) {
  LaunchConfig launch = config(dim3(1), dim3(256));
  launch.buffers = {buffer("values", values, 256, BufferAccess::read),
                    buffer("out", out, 259 + 6 * 8, BufferAccess::write)};
  TESSERA_LAUNCH(integer_builtins_kernel, launch, values, out);
  finish(launch);
}

void atomics(int* ints, unsigned* unsigneds, unsigned long long* wide, long long* signed_wide, float* floats,
             __nv_bfloat16* bf16s, __half* halves, int threads) {
  LaunchConfig launch = config(dim3(1), dim3(threads));
  launch.buffers = {buffer("ints", ints, 4, BufferAccess::read_write),
                    buffer("unsigneds", unsigneds, 6, BufferAccess::read_write),
                    buffer("wide", wide, 2, BufferAccess::read_write),
                    buffer("signed_wide", signed_wide, 1, BufferAccess::read_write),
                    buffer("floats", floats, 2, BufferAccess::read_write),
                    buffer("bf16s", bf16s, 1, BufferAccess::read_write),
                    buffer("halves", halves, 1, BufferAccess::read_write)};
  TESSERA_LAUNCH(atomics_kernel, launch, ints, unsigneds, wide, signed_wide, floats, bf16s, halves);
  finish(launch);
}

void shuffle_bfloat162(const __nv_bfloat162* in, __nv_bfloat162* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("in", in, 32, BufferAccess::read), buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(shuffle_bfloat162_kernel, launch, in, out);
  finish(launch);
}

void bounded_wait(int* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 1, BufferAccess::write)};
  TESSERA_LAUNCH(bounded_wait_kernel, launch, out);
  finish(launch);
}

}  // namespace conformance_kernels
