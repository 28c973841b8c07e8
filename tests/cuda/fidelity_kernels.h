// Host entry points of the kernels that hold the simulator to
// compute-sanitizer's standard and to CUDA as people write it: for each
// check, a deliberately broken kernel with the one bug the simulator must
// name, and a correct kernel in the same idiom that must pass without a
// report. Pointers are simulated device memory; each call waits for its
// launch, so a kernel's error is thrown by the call.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace fidelity_kernels {

// initcheck. out[i] = in[i] + 1 for n values.
void add_one(const float* in, float* out, int n);
// out[i] = 0 for n values (a fill kernel, as cudaMemset would be).
void fill_zero(float* out, int n);
// Each block sums its 64 values of `in` into a static __shared__ accumulator
// with atomicAdd; `zero_first` says whether thread 0 zeroes it first.
void block_totals(const float* in, float* out, int blocks, bool zero_first);
// out[t] = the next thread's staged value through dynamic shared memory of
// n + 1 floats; the last thread reads the slot no thread wrote unless
// `stage_sentinel` (then thread 0 also stages 0 there).
void read_next_staged(const float* in, float* out, int n, bool stage_sentinel);

// memcheck against views. `packed` is [rows, 3 * width] (q, k and v side by
// side, as attention's projection); the launch declares the q view alone
// ([rows, width] with row stride 3 * width) and writes q[row][col] = 1,
// addressing rows with `row_stride` (3 * width is right, width the bug).
void write_q_view(float* packed, int rows, int width, int row_stride);
// out[i] = the float4 at in + offset_floats + 4 i (in holds 4 n + 4 floats):
// an offset that is not a multiple of 4 floats is a misaligned float4.
void load_float4(const float* in, float* out, int n, int offset_floats);
// out[i] = low + high of the __nv_bfloat162 at in + offset + 2 i.
void load_bfloat162(const __nv_bfloat16* in, float* out, int n, int offset);

// A launch with no stream (CUDA's legacy default stream).
void launch_on_null_stream(float* out);

// __syncwarp(mask). Each lane stores its lane number to shared memory, the
// warp syncs, and lane l reads lane (l + 16) % 32's slot. `half_masks`: the
// two halves sync separately (__syncwarp(0x0000ffff) / (0xffff0000)), which
// does not order the halves: a race.
void swap_halves(int* out, bool half_masks);
// Lanes l and l + 1 pass values along a chain of pairwise __syncwarp(mask)
// calls (lane 0 to 1, then 1 to 2, ...): lane 31 reads lane 0's store,
// ordered transitively.
void pass_along_pairs(int* out);

// Spin-waits. Thread t polls a device counter (volatile) until it equals t,
// writes out[t] = t, then increments it: a chain through all threads of one
// block that only independent thread scheduling lets finish.
void ticket_chain(int* counter, int* out, int threads);
// Thread 0 polls a flag no thread ever sets (`use_atomic`: atomicCAS, else a volatile load).
void spin_forever(int* flag, bool use_atomic);

// Exited lanes. Lanes 16-31 return; the others __shfl_sync(0xffffffff, ...)
// from lane 0 (defined: out[l] = 0) or, with `read_exited`, __shfl_down_sync by 8 (lanes 8-15
// read exited lanes: undefined).
void shuffle_after_exit(int* out, bool read_exited);

// Same-value writes. Every thread stores 1 to one shared flag, then after a
// barrier thread 0 copies it to out[0]: benign. With `then_race`, a later
// line has every thread store its own index to another shared word, copied
// to out[1]: a real race.
void same_value_flag(int* out, bool then_race);

}  // namespace fidelity_kernels
