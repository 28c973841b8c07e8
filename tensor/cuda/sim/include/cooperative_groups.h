// Cooperative groups for the simulator: the toolkit's <cooperative_groups.h>
// is device code (empty without nvcc), so the simulator build puts this one
// first on the include path. It holds what kernels use of the API, built on
// the simulator's barriers and warp operations: this_thread_block(),
// tiled_partition<N>() for N in 1, 2, 4, ..., 32 with thread_rank,
// meta_group_rank/size, sync, the shuffles and votes; reduce() is in
// <cooperative_groups/reduce.h>. Grid groups (cooperative launches),
// coalesced_threads() and runtime-sized partitions are not here: using them
// fails to compile, naming what is missing.
#pragma once

#include "tensor/cuda/portability.h"

namespace cooperative_groups {

class thread_block {
 public:
  void sync() const { __syncthreads(); }
  unsigned long long thread_rank() const {
    return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
  }
  unsigned long long num_threads() const { return static_cast<unsigned long long>(blockDim.x) * blockDim.y * blockDim.z; }
  unsigned long long size() const { return num_threads(); }
  dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
  dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
  dim3 dim_threads() const { return dim3(blockDim.x, blockDim.y, blockDim.z); }
  dim3 group_dim() const { return dim_threads(); }
};

inline thread_block this_thread_block() { return thread_block{}; }
inline void sync(const thread_block& block) { block.sync(); }

// A tile of Size consecutive threads of the block (in thread_rank order),
// which must lie inside one warp: its lanes sync with __syncwarp(mask) and
// exchange values with the *_sync intrinsics over that mask.
template <unsigned Size>
class thread_block_tile {
  static_assert(Size >= 1 && Size <= 32 && (Size & (Size - 1)) == 0,
                "tiled_partition<N>: N must be a power of two up to 32");

 public:
  static constexpr unsigned long long num_threads() { return Size; }
  static constexpr unsigned long long size() { return Size; }
  unsigned long long thread_rank() const { return rank_in_block() % Size; }
  unsigned long long meta_group_rank() const { return rank_in_block() / Size; }
  unsigned long long meta_group_size() const { return (this_thread_block().size() + Size - 1) / Size; }
  void sync() const { __syncwarp(mask()); }

  template <typename T>
  T shfl(T value, int source_rank) const { return __shfl_sync(mask(), value, source_rank, Size); }
  template <typename T>
  T shfl_down(T value, unsigned delta) const { return __shfl_down_sync(mask(), value, delta, Size); }
  template <typename T>
  T shfl_up(T value, unsigned delta) const { return __shfl_up_sync(mask(), value, delta, Size); }
  template <typename T>
  T shfl_xor(T value, unsigned lane_mask) const { return __shfl_xor_sync(mask(), value, static_cast<int>(lane_mask), Size); }
  int any(int predicate) const { return __any_sync(mask(), predicate); }
  int all(int predicate) const { return __all_sync(mask(), predicate); }
  // The tile's lanes whose predicate holds, as bits from the tile's rank 0.
  unsigned ballot(int predicate) const { return __ballot_sync(mask(), predicate) >> first_lane(); }

 private:
  static unsigned long long rank_in_block() { return this_thread_block().thread_rank(); }
  static unsigned first_lane() { return static_cast<unsigned>(rank_in_block() % 32 / Size * Size); }
  static unsigned mask() {
    const unsigned lanes = Size == 32 ? 0xffffffffu : (1u << Size) - 1u;
    return lanes << first_lane();
  }
};

template <unsigned Size>
thread_block_tile<Size> tiled_partition(const thread_block&) {
  return thread_block_tile<Size>{};
}
template <unsigned Size>
void sync(const thread_block_tile<Size>& tile) {
  tile.sync();
}

}  // namespace cooperative_groups
