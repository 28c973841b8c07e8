// Host entry points of the kernels the simulator suite runs: correct kernels
// whose results are checked, and deliberately broken ones, each with the one
// bug the simulator must name. Pointers are simulated device memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace tessera {
class Stream;
}

namespace simulator_kernels {

// out[block] = sum of in[block * threads, (block + 1) * threads): a shared-memory tree with barriers.
void block_sums(const float* in, float* out, int blocks, int threads);
// out[warp] = sum of in's 32 values of each warp, by __shfl_down_sync (warps: a multiple of 4).
void warp_sums(const float* in, float* out, int warps);
// out[i] = in[i] shuffled: lane l takes lane (l + 1) % 32 by __shfl_sync, then __shfl_up/xor results.
void warp_shuffles(const int* in, int* out, int warps);
// ballot/any/all of in[i] > 0 per warp: out[3 * warp + {0, 1, 2}].
void warp_votes(const int* in, unsigned* out, int warps);
// counts[in[i]] += 1 with atomicAdd; and total += in values as float atomics.
void histogram(const int* in, int n, int* counts, int bins, float* total);
// out[i] = in[n - 1 - i] staged through dynamic shared memory.
void reverse_in_shared(const float* in, float* out, int n, tessera::Stream* stream);
// Writes blockIdx.x into out in the order blocks run (atomic counter).
void block_order(int* out, int* counter, int blocks);
// For each float4 (x, y, z, w) of in: bf16_out gets bf16(x), bf16(x) * bf16(y),
// -bf16(y); half_out gets f16(z), f16(z) * f16(w) (__hmul), f16(w) (through a __half2).
void sixteen_bit_floats(const float* in, __nv_bfloat16* bf16_out, __half* half_out, int quads);
// out[i] = i for a 3-D grid of 3-D blocks.
void coordinates(int* out, int grid_x, int grid_y, int grid_z, int block_x, int block_y, int block_z);

// Broken kernels.
void race_on_shared(float* out);                       // two threads write one shared word
void reduction_missing_barrier(const float* in, float* out, int threads);  // no __syncthreads in the tree
void divergent_barrier(float* out);                    // __syncthreads inside `if (threadIdx.x < 16)`
void barriers_at_two_sites(float* out);                // even threads at one barrier, odd at another
void write_past_end(float* out, int n, tessera::Stream* stream);  // writes out[n]
void read_undeclared(const float* declared, const float* undeclared, float* out);
void write_read_only(float* in);                       // writes a buffer declared read-only
void shared_overflow(float* out, int dynamic_bytes);   // writes past dynamic shared memory
void shuffle_mask_mismatch(int* out);                  // lanes 0-15 shuffle with the full mask, 16-31 with 0xffff0000
void shuffle_exited_lane(int* out);  // lanes 16-31 wait at a barrier while lanes 0-15 shuffle with a full mask
void syncwarp_orders_lanes(int* out);                  // correct: lanes exchange through shared memory with __syncwarp
void too_many_threads(float* out);                     // a 32 x 33 block: 1056 threads
void too_much_shared(float* out, bool opt_in);         // 64 KiB of dynamic shared memory
// Touches `floats` floats of a static __shared__ array of 12544 (49 KiB) next
// to `dynamic_bytes` of dynamic shared memory.
void static_shared(float* out, int floats, int dynamic_bytes, bool opt_in);

}  // namespace simulator_kernels
