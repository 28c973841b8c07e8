// Kernels for tests/cuda/test_mma.cpp: tensor/cuda/mma.h as a kernel uses
// it, compiled for the simulator with its instrumentation and, in an nvidia
// build, by nvcc for sm_80/sm_90/sm_100. Fragments are loaded with the PTX
// ISA's formulas written out here (not through mma_a_position and friends),
// so the loads and the emulation are two independent readings of the layout.
// The broken kernels each hold the one misuse a test expects the simulator
// to name.
#include "tests/cuda/mma_kernels.h"

#include "tensor/cuda/mma.h"
#include "tensor/cuda/portability.h"
#include "tests/cuda/test_launch.h"

using tessera::cuda::BufferAccess;
using tessera::cuda::LaunchConfig;
using tessera::testing::buffer;
using tessera::testing::config;
using tessera::testing::finish;

namespace mma_kernels {

namespace {

using tessera::cuda::ldmatrix_x4;
using tessera::cuda::ldmatrix_x4_trans;
using tessera::cuda::mma_m16n8k16_bf16;
using tessera::cuda::mma_m16n8k16_f16;

// a: [tiles][16][16] row-major as 2-element words (word of (row, col) =
// row * 8 + col / 2); b: [tiles][8 n][16 k] likewise (word n * 8 + k / 2);
// c, d: [tiles][16][8] row-major.
__global__ void __launch_bounds__(256) mma_from_memory_kernel(const uint32_t* a, const uint32_t* b, const float* c,
                                                              float* d, bool half_inputs, int a_lane_flip) {
  const unsigned thread = threadIdx.x + blockDim.x * threadIdx.y;
  const int lane = static_cast<int>(thread % 32);
  const int tile = static_cast<int>((blockIdx.x * blockDim.x * blockDim.y + thread) / 32);
  const int group = lane >> 2, in_group = lane % 4;  // PTX's groupID and threadID_in_group
  const int a_group = (lane ^ a_lane_flip) >> 2, a_in_group = (lane ^ a_lane_flip) % 4;
  const uint32_t* a_tile = a + tile * 128;
  const uint32_t* b_tile = b + tile * 64;
  const float* c_tile = c + tile * 128;
  // A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]
  const uint32_t a_fragment[4] = {a_tile[a_group * 8 + a_in_group], a_tile[(a_group + 8) * 8 + a_in_group],
                                  a_tile[a_group * 8 + 4 + a_in_group], a_tile[(a_group + 8) * 8 + 4 + a_in_group]};
  // B[2t..][g], B[2t+8..][g]
  const uint32_t b_fragment[2] = {b_tile[group * 8 + in_group], b_tile[group * 8 + 4 + in_group]};
  // C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
  const float c_fragment[4] = {c_tile[group * 8 + 2 * in_group], c_tile[group * 8 + 2 * in_group + 1],
                               c_tile[(group + 8) * 8 + 2 * in_group], c_tile[(group + 8) * 8 + 2 * in_group + 1]};
  float d_fragment[4];
  if (half_inputs) {
    mma_m16n8k16_f16(d_fragment, a_fragment, b_fragment, c_fragment);
  } else {
    mma_m16n8k16_bf16(d_fragment, a_fragment, b_fragment, c_fragment);
  }
  float* d_tile = d + tile * 128;
  d_tile[group * 8 + 2 * in_group] = d_fragment[0];
  d_tile[group * 8 + 2 * in_group + 1] = d_fragment[1];
  d_tile[(group + 8) * 8 + 2 * in_group] = d_fragment[2];
  d_tile[(group + 8) * 8 + 2 * in_group + 1] = d_fragment[3];
}

// Shared rows of 16 elements padded to 24: 48 bytes apart, so consecutive
// rows are not contiguous and every 8-element half row is 16-byte aligned.
constexpr int kPaddedRow = 24;

__global__ void __launch_bounds__(32) mma_through_ldmatrix_kernel(const uint16_t* a, const uint16_t* b, float* d) {
  uint16_t* a_shared = dynamic_shared_memory<uint16_t>();
  uint16_t* b_shared = a_shared + 16 * kPaddedRow;
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 256; i += 32) {
    a_shared[i / 16 * kPaddedRow + i % 16] = a[i];
    b_shared[i / 16 * kPaddedRow + i % 16] = b[i];
  }
  __syncthreads();
  // Lane l gives row l % 8 of matrix l / 8. A's matrices are its quarters
  // (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in the order of a[0..3]; B's are
  // (k 0-7 | 8-15) x (n 0-7 | 8-15), read transposed: b for n 0-7, then 8-15.
  const int matrix = lane / 8, row = lane % 8;
  uint32_t a_fragment[4], b_fragments[4];
  ldmatrix_x4(a_fragment, &a_shared[(matrix % 2 * 8 + row) * kPaddedRow + matrix / 2 * 8]);
  ldmatrix_x4_trans(b_fragments, &b_shared[(matrix % 2 * 8 + row) * kPaddedRow + matrix / 2 * 8]);
  const uint32_t b_low[2] = {b_fragments[0], b_fragments[1]};
  const uint32_t b_high[2] = {b_fragments[2], b_fragments[3]};
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float d_low[4], d_high[4];
  mma_m16n8k16_bf16(d_low, a_fragment, b_low, zero);
  mma_m16n8k16_bf16(d_high, a_fragment, b_high, zero);
  const int group = lane >> 2, in_group = lane % 4;
  for (int element = 0; element < 4; ++element) {
    const int at = (group + (element >= 2 ? 8 : 0)) * 16 + 2 * in_group + (element & 1);
    d[at] = d_low[element];
    d[at + 8] = d_high[element];
  }
}

__global__ void __launch_bounds__(32) ldmatrix_rows_kernel(const uint16_t* matrix, int rows, const int* row_of_lane,
                                                           uint32_t* out) {
  uint16_t* staged = dynamic_shared_memory<uint16_t>();
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < rows * 8; i += 32) staged[i] = matrix[i];
  __syncthreads();
  uint32_t plain[4], transposed[4];
  ldmatrix_x4(plain, &staged[row_of_lane[lane] * 8]);
  ldmatrix_x4_trans(transposed, &staged[row_of_lane[lane] * 8]);
  for (int m = 0; m < 4; ++m) {
    out[lane * 8 + m] = plain[m];
    out[lane * 8 + 4 + m] = transposed[m];
  }
}

__global__ void __launch_bounds__(32) mma_by_half_a_warp_kernel(float* out) {
  const int lane = static_cast<int>(threadIdx.x);
  if (lane >= 16) return;
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  const float c[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  float d[4];
  mma_m16n8k16_bf16(d, a, b, c);
  out[lane] = d[0];
}

__global__ void __launch_bounds__(32) mma_of_zeros_kernel(float* out) {
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  const float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float d[4];
  mma_m16n8k16_bf16(d, a, b, c);
  out[threadIdx.x] = d[0];
}

__global__ void __launch_bounds__(32) mma_at_two_sites_kernel(float* out) {
  const int lane = static_cast<int>(threadIdx.x);
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  const float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float d[4];
  if (lane < 16) {
    mma_m16n8k16_bf16(d, a, b, c);
  } else {
    mma_m16n8k16_bf16(d, a, b, c);
  }
  out[lane] = d[0];
}

__global__ void __launch_bounds__(32) ldmatrix_from_device_memory_kernel(const uint16_t* matrix, uint32_t* out) {
  const int lane = static_cast<int>(threadIdx.x);
  uint32_t r[4];
  ldmatrix_x4(r, &matrix[lane * 8]);
  out[lane] = r[0];
}

__global__ void __launch_bounds__(32) ldmatrix_misaligned_kernel(uint32_t* out) {
  uint16_t* staged = dynamic_shared_memory<uint16_t>();
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = 0; i < 8; ++i) staged[4 + lane * 8 + i] = static_cast<uint16_t>(lane);
  __syncthreads();
  uint32_t r[4];
  ldmatrix_x4(r, &staged[4 + lane * 8]);
  out[lane] = r[0];
}

__global__ void __launch_bounds__(32) ldmatrix_after_neighbour_writes_kernel(uint32_t* out, bool syncwarp) {
  uint16_t* rows = dynamic_shared_memory<uint16_t>();
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = 0; i < 8; ++i) rows[lane * 8 + i] = static_cast<uint16_t>(lane * 8 + i);
  if (syncwarp) __syncwarp();
  uint32_t r[4];
  ldmatrix_x4(r, &rows[(lane + 1) % 32 * 8]);
  out[lane] = r[0];
}

}  // namespace

void mma_from_memory(const uint16_t* a, const uint16_t* b, const float* c, float* d, int tiles, Inputs inputs,
                     int block_x, int block_y, int a_lane_flip) {
  LaunchConfig launch = config(dim3(tiles * 32 / (block_x * block_y)), dim3(block_x, block_y));
  launch.buffers = {buffer("a", a, int64_t{tiles} * 256, BufferAccess::read),
                    buffer("b", b, int64_t{tiles} * 128, BufferAccess::read),
                    buffer("c", c, int64_t{tiles} * 128, BufferAccess::read),
                    buffer("d", d, int64_t{tiles} * 128, BufferAccess::write)};
  TESSERA_LAUNCH(mma_from_memory_kernel, launch, reinterpret_cast<const uint32_t*>(a),
                 reinterpret_cast<const uint32_t*>(b), c, d, inputs == Inputs::f16, a_lane_flip);
  finish(launch);
}

void mma_through_ldmatrix(const uint16_t* a, const uint16_t* b, float* d) {
  LaunchConfig launch = config(dim3(1), dim3(32), int64_t{2} * 16 * kPaddedRow * sizeof(uint16_t));
  launch.buffers = {buffer("a", a, 256, BufferAccess::read), buffer("b", b, 256, BufferAccess::read),
                    buffer("d", d, 256, BufferAccess::write)};
  TESSERA_LAUNCH(mma_through_ldmatrix_kernel, launch, a, b, d);
  finish(launch);
}

void ldmatrix_rows(const uint16_t* matrix, int rows, const int* row_of_lane, uint32_t* out) {
  LaunchConfig launch = config(dim3(1), dim3(32), int64_t{rows} * 8 * sizeof(uint16_t));
  launch.buffers = {buffer("matrix", matrix, int64_t{rows} * 8, BufferAccess::read),
                    buffer("row_of_lane", row_of_lane, 32, BufferAccess::read),
                    buffer("out", out, 32 * 8, BufferAccess::write)};
  TESSERA_LAUNCH(ldmatrix_rows_kernel, launch, matrix, rows, row_of_lane, out);
  finish(launch);
}

void mma_by_half_a_warp(float* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(mma_by_half_a_warp_kernel, launch, out);
  finish(launch);
}

void mma_in_a_partial_warp(float* out) {
  LaunchConfig launch = config(dim3(1), dim3(16));
  launch.buffers = {buffer("out", out, 16, BufferAccess::write)};
  TESSERA_LAUNCH(mma_of_zeros_kernel, launch, out);
  finish(launch);
}

void mma_at_two_sites(float* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(mma_at_two_sites_kernel, launch, out);
  finish(launch);
}

void ldmatrix_from_device_memory(const uint16_t* matrix, uint32_t* out) {
  LaunchConfig launch = config(dim3(1), dim3(32));
  launch.buffers = {buffer("matrix", matrix, 256, BufferAccess::read), buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(ldmatrix_from_device_memory_kernel, launch, matrix, out);
  finish(launch);
}

void ldmatrix_misaligned(uint32_t* out) {
  LaunchConfig launch = config(dim3(1), dim3(32), (4 + 32 * 8) * sizeof(uint16_t));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(ldmatrix_misaligned_kernel, launch, out);
  finish(launch);
}

void ldmatrix_after_neighbour_writes(uint32_t* out, bool syncwarp) {
  LaunchConfig launch = config(dim3(1), dim3(32), 32 * 8 * sizeof(uint16_t));
  launch.buffers = {buffer("out", out, 32, BufferAccess::write)};
  TESSERA_LAUNCH(ldmatrix_after_neighbour_writes_kernel, launch, out, syncwarp);
  finish(launch);
}

}  // namespace mma_kernels
