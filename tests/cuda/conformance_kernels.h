// Host entry points of the conformance suite (tests/cuda/test_conformance.cpp):
// reductions, softmax, layer norm and the integer, atomic and warp built-ins
// written the ways CUDA code commonly is (cooperative groups, warp shuffles,
// vector loads with cache hints, online softmax, sm_80 warp reductions). The
// same source compiles unchanged with nvcc for sm_80/90/100 (the nvidia
// build) and runs on the simulator against CPU references. Pointers are
// device memory; each call waits for its launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace conformance_kernels {

// out[row] = the sum of x[row, :] (cols any size): a block per row, a
// cooperative-groups tile<32> reduce, then warp partials through shared memory.
void row_sums_cooperative(const float* x, float* out, int rows, int cols);
// The same sums by a shared-memory tree in `extern __shared__ float partial[]`.
void row_sums_extern_shared(const float* x, float* out, int rows, int cols);
// out[row] = the maximum of x[row, :]: a warp per row, __shfl_down_sync.
void row_max_warp(const float* x, float* out, int rows, int cols);
// Row softmax, a warp per row, online (running maximum and rescaled sum in one pass).
void softmax_online(const float* x, float* y, int rows, int cols);
// Layer norm over the last dim (cols a multiple of 4) with float4 loads
// (__ldcs), rsqrtf, warp shuffles and streaming stores (__stcs); weight/bias per column.
void layer_norm_vectorized(const float* x, const float* weight, const float* bias, float* y, int rows, int cols);
// For 256 values: out[0..255] per-thread results and out[256..] block/warp results of the
// integer built-ins (see the test for the list).
void integer_builtins(const unsigned* values, int* out);
// Every atomic kind on a small record of counters (see the test).
void atomics(int* ints, unsigned* unsigneds, unsigned long long* wide, long long* signed_wide, float* floats,
             __nv_bfloat16* bf16s, __half* halves, int threads);
// out[i] = the __nv_bfloat162 of lane (i + 1) % 32, shuffled whole.
void shuffle_bfloat162(const __nv_bfloat162* in, __nv_bfloat162* out);
// Thread 0 waits for 100 ticks of clock64, sleeping with __nanosleep; out[0] = 1 when done.
void bounded_wait(int* out);

}  // namespace conformance_kernels
