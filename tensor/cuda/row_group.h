// What the row-wise cuda kernels (softmax, layer/RMS norm, cross-entropy)
// share: a row is handled by a group of threads, a warp for short rows or a
// whole block for long ones. Thread `lane` of a group owns the columns lane,
// lane + G, lane + 2G, ... (coalesced), keeps them in registers where the row
// fits (RowSlice), and the group combines its threads' partial results with a
// fixed butterfly then a fixed order over warps, so every thread gets the same
// bits on every run. Included by .cu files only.
#pragma once

#include <cmath>
#include <limits>

#include "tensor/cuda/kernel_loop.h"
#include "tensor/element_conversion.h"

namespace tessera::cuda {

constexpr int kWarpThreads = 32;

// The arithmetic and statistics type of element type T: f32 for f32 and
// bf16, f64 for f64.
template <typename T>
struct AccumulatorOf {
  using type = float;
};
template <>
struct AccumulatorOf<double> {
  using type = double;
};
template <typename T>
using Accumulator = typename AccumulatorOf<T>::type;

// Calls fn(T{}) for the element types the row kernels take (f32, f64, bf16);
// refuses any other as "cuda::<kernel>: computes in f32, f64 or bf16, got <dtype>".
template <typename Fn>
void visit_row_dtype(DType dtype, const char* kernel, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(BFloat16{});
    default: refuse_operands(kernel, "computes in f32, f64 or bf16, got", dtype);
  }
}

// A running maximum and the sum of exp(x - max) over the values seen: the
// online softmax, so a row is read once however long it is.
// (Trivial, so it can live in __shared__ memory: start from none().)
template <typename A>
struct MaxSum {
  A max;
  A sum;

  __device__ static MaxSum none() { return {-std::numeric_limits<A>::infinity(), A(0)}; }

  __device__ void add(A x) {
    if (x > max) {
      sum = sum * std::exp(max - x) + A(1);
      max = x;
    } else if (max != -std::numeric_limits<A>::infinity()) {
      sum += std::exp(x - max);
    }
  }

  // The values of a chunk at once: the maximum moves (and the sum is
  // rescaled) at most once, then one exp a value, with no branch between
  // them. add's compare, branch and second exp per value bound the
  // cross-entropy by instruction issue, not HBM.
  template <int N>
  __device__ void add_chunk(const A (&values)[N]) {
    A chunk_max = values[0];
#pragma unroll
    for (int j = 1; j < N; ++j) chunk_max = std::fmax(chunk_max, values[j]);
    if (chunk_max > max) {
      sum = sum * std::exp(max - chunk_max);
      max = chunk_max;
    }
    if (max == -std::numeric_limits<A>::infinity()) return;
#pragma unroll
    for (int j = 0; j < N; ++j) sum += std::exp(values[j] - max);
  }
};

// Commutative bit for bit (a, b gives what b, a gives), which the butterfly needs.
template <typename A>
__device__ MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
  MaxSum<A> result = MaxSum<A>::none();
  result.max = a.max > b.max ? a.max : b.max;
  if (result.max == -std::numeric_limits<A>::infinity()) return result;
  result.sum = a.sum * std::exp(a.max - result.max) + b.sum * std::exp(b.max - result.max);
  return result;
}

template <typename A>
__device__ A xor_shuffle(A value, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
}
template <typename A>
__device__ MaxSum<A> xor_shuffle(MaxSum<A> value, int lane_mask) {
  return {xor_shuffle(value.max, lane_mask), xor_shuffle(value.sum, lane_mask)};
}

struct Plus {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
};
struct Combine {
  template <typename A>
  __device__ MaxSum<A> operator()(MaxSum<A> a, MaxSum<A> b) const {
    return combine(a, b);
  }
};

// kGroupThreads threads per row: a warp of a kThreads block, or the whole
// block (then blockDim.x == kGroupThreads).
template <int kGroupThreads>
struct RowGroup {
  static constexpr int kSize = kGroupThreads;
  static constexpr bool kIsWarp = kGroupThreads == kWarpThreads;
  static constexpr int kBlockThreads = kIsWarp ? kThreads : kGroupThreads;
  static constexpr int kPerBlock = kBlockThreads / kGroupThreads;

  __device__ static int lane() { return static_cast<int>(threadIdx.x) % kGroupThreads; }
  __device__ static int in_block() { return static_cast<int>(threadIdx.x) / kGroupThreads; }
  __device__ static int64_t first() { return static_cast<int64_t>(blockIdx.x) * kPerBlock + in_block(); }
  __device__ static int64_t stride() { return static_cast<int64_t>(gridDim.x) * kPerBlock; }

  // op over the group's values; every thread of the group gets the same bits.
  template <typename V, typename Op>
  __device__ static V all_reduce(V value, Op op) {
    for (int mask = kWarpThreads / 2; mask > 0; mask /= 2) value = op(value, xor_shuffle(value, mask));
    if constexpr (!kIsWarp) {
      __shared__ V warp_values[kGroupThreads / kWarpThreads];
      __syncthreads();  // the previous reduction's readers are done
      if (threadIdx.x % kWarpThreads == 0) warp_values[threadIdx.x / kWarpThreads] = value;
      __syncthreads();
      value = warp_values[0];
      for (int warp = 1; warp < kGroupThreads / kWarpThreads; ++warp) value = op(value, warp_values[warp]);
    }
    return value;
  }

  // The value lane 0 holds, in every thread of the group (one load instead of G).
  template <typename V>
  __device__ static V from_lane0(V value) {
    if constexpr (kIsWarp) {
      return __shfl_sync(0xffffffffu, value, 0);
    } else {
      __shared__ V shared_value;
      __syncthreads();
      if (threadIdx.x == 0) shared_value = value;
      __syncthreads();
      return shared_value;
    }
  }
};

// The columns of one row a thread owns (lane + i G for i < kPerThread), in
// the arithmetic type: loaded once into registers, so passes over the row
// after the first read no memory. kPerThread == 0 is a row too long for
// registers: each pass reads the row again.
template <typename T, int kGroupThreads, int kPerThread>
struct RowSlice {
  using A = Accumulator<T>;
  const T* row;
  int64_t cols;
  int lane;
  A values[kPerThread > 0 ? kPerThread : 1];

  __device__ RowSlice(const T* row_data, int64_t columns, int thread_lane)
      : row(row_data), cols(columns), lane(thread_lane) {
    if constexpr (kPerThread > 0) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int64_t col = lane + static_cast<int64_t>(i) * kGroupThreads;
        values[i] = row != nullptr && col < cols ? convert<A>(row[col]) : A(0);
      }
    }
  }

  // The value at slot i, column col (of this thread's columns).
  __device__ A at(int i, int64_t col) const {
    if constexpr (kPerThread > 0) {
      return values[i];
    } else {
      return convert<A>(row[col]);
    }
  }

  // Makes the row row + addend (a row of cols), each value rounded to T as
  // binary add stores it, and writes those values to `sum` (a row of cols):
  // the passes after this one see the rounded sum. Rows held in registers only.
  __device__ void add_rounded(const T* addend, T* sum) {
    static_assert(kPerThread > 0, "add_rounded: the row must be held in registers");
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t col = lane + static_cast<int64_t>(i) * kGroupThreads;
      if (col >= cols) continue;
      const T rounded = convert<T>(values[i] + convert<A>(addend[col]));
      sum[col] = rounded;
      values[i] = convert<A>(rounded);
    }
  }

  // fn(slot, column, value) for this thread's columns, in column order.
  template <typename Fn>
  __device__ void for_each(Fn&& fn) const {
    if constexpr (kPerThread > 0) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int64_t col = lane + static_cast<int64_t>(i) * kGroupThreads;
        if (col < cols) fn(i, col, values[i]);
      }
    } else {
      for (int64_t col = lane; col < cols; col += kGroupThreads) fn(0, col, convert<A>(row[col]));
    }
  }
};

// The register shapes of the row kernels by row length: a warp with 8
// values per thread up to 256 columns, blocks of 128 and 512 threads with 8
// per thread up to 4096, 16 per thread up to 8192, then a 512-thread block
// re-reading the row (kPerThread 0). No block of 1024: its 64 registers a
// thread make f64 rows spill. fn is called as fn.template operator()<G, P>().
constexpr int64_t kMostCachedColumns = 512 * 16;

template <typename Fn>
void visit_row_shape(int64_t cols, Fn&& fn) {
  if (cols <= 32 * 8) return fn.template operator()<32, 8>();
  if (cols <= 128 * 8) return fn.template operator()<128, 8>();
  if (cols <= 512 * 8) return fn.template operator()<512, 8>();
  if (cols <= kMostCachedColumns) return fn.template operator()<512, 16>();
  return fn.template operator()<512, 0>();
}

// A launch of `groups` row groups of kGroupThreads (at most kMaxRowBlocks
// blocks; groups stride over the rest).
constexpr int64_t kMaxRowBlocks = 1024;

template <int kGroupThreads>
LaunchConfig row_config(int64_t groups, const KernelLaunch& launch) {
  using Group = RowGroup<kGroupThreads>;
  LaunchConfig config;
  const int64_t blocks = std::clamp<int64_t>((groups + Group::kPerBlock - 1) / Group::kPerBlock, 1, kMaxRowBlocks);
  config.grid = dim3(static_cast<unsigned>(blocks));
  config.block = dim3(Group::kBlockThreads);
  config.buffers = launch.buffers;
  config.stream = launch.stream;
  return config;
}

}  // namespace tessera::cuda
