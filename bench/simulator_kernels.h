// Host entry points of bench/simulator's kernels (pointers are simulated device memory).
#pragma once

namespace simulator_bench {

void scale(const float* in, float* out, int n);                    // out = 2 in, a thread per element
void block_tree_sum(const float* in, float* out, int blocks);      // 256-thread blocks, 8 barriers each
void warp_shuffle_sum(const float* in, float* out, int warps);     // 5 shuffles per warp; warps: a multiple of 8

}  // namespace simulator_bench
