// What the cuda kernel sources share: the block size, the grid for a number
// of work items, the grid-stride loop's start and step, and 16-byte packs
// for dense loads and stores. Included by .cu files only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

constexpr int kThreads = 256;
// Enough blocks to fill a GPU: an H100 holds 132 SMs x 2048 threads = 1056
// blocks of 256 at once. The cap was 256 (a quarter of that), and memory-bound
// kernels moved 1.1 TB/s, not 3 (ncu, tools/gpu_check.sh, 2026-11-26).
constexpr int64_t kMaxBlocks = 1024;

// At most kMaxBlocks blocks of kThreads: grid-stride loops cover the rest.
inline LaunchConfig config_for(int64_t work_items, const KernelLaunch& launch) {
  LaunchConfig config;
  const int64_t blocks = std::max<int64_t>(1, std::min(kMaxBlocks, (work_items + kThreads - 1) / kThreads));
  config.grid = dim3(static_cast<unsigned>(blocks));
  config.block = dim3(kThreads);
  config.buffers = launch.buffers;
  config.stream = launch.stream;
  return config;
}

__device__ inline int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t index_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// The last i in [0, count) with firsts[i] <= value, by binary search
// (firsts ascending, firsts[0] <= value): which tensor of a multi-tensor
// launch owns a block or chunk, given where each tensor's first one is.
__device__ inline int last_at_or_before(const int32_t* firsts, int count, int32_t value) {
  int low = 0, high = count - 1;
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (firsts[middle] <= value) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

// kCount values of T moved as one load or store: 16 bytes (128 bits) unless
// a narrower count is asked for.
template <typename T, int Count = 16 / sizeof(T)>
struct alignas(sizeof(T) * Count) Pack {
  static constexpr int kCount = Count;
  T values[Count];
};

// Calls fn(T{}) for the dtypes arithmetic kernels compute in (f32, f64, i32,
// i64); refuses any other as "cuda::<kernel>: <what> <dtype>".
template <typename Fn>
void visit_numeric(DType dtype, const char* kernel, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    default: refuse_operands(kernel, what, dtype);
  }
}

// Calls fn(Word{}) with the unsigned word of dtype's size: for kernels that
// move elements without reading them.
template <typename Fn>
void visit_word(DType dtype, Fn&& fn) {
  switch (element_size(dtype)) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    default: return fn(uint64_t{});
  }
}

template <typename T>
bool packable(const Operand& operand) {
  return operand.contiguous && reinterpret_cast<uintptr_t>(operand.data) % 16 == 0 && sizeof(T) <= 16;
}

}  // namespace tessera::cuda
