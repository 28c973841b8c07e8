// Host entry points of the kernels that check tensor/cuda/mma.h
// (tests/cuda/test_mma.cpp): warps that load fragments from device memory or
// through ldmatrix, run mma.m16n8k16 and store D, and broken kernels each
// holding the one misuse the simulator must name. 16-bit matrices are passed
// as their bits; pointers are simulated device memory.
#pragma once

#include <cstdint>

namespace mma_kernels {

enum class Inputs { bf16, f16 };

// For each of `tiles` tiles, one warp computes d = a b + c with mma.m16n8k16:
// a [tiles][16][16] row-major, b [tiles][8][16] (column n holds its 16 k
// values contiguously), c and d [tiles][16][8] row-major. Blocks of
// block_x * block_y threads (a multiple of 32 dividing 32 * tiles); warp w
// of the grid owns tile w. Lane l loads A's fragment as lane l ^ a_lane_flip would (0: as the PTX
// ISA says; anything else is a deliberate layout bug).
void mma_from_memory(const uint16_t* a, const uint16_t* b, const float* c, float* d, int tiles, Inputs inputs,
                     int block_x, int block_y, int a_lane_flip = 0);

// One warp: a [16][16] and b [16][16] (row-major, k by n) staged in shared
// memory with padded rows, A's fragment by ldmatrix_x4, B's fragments for n
// 0-7 and 8-15 by ldmatrix_x4_trans, two bf16 mmas with c = 0:
// d [16][16] = a b, row-major.
void mma_through_ldmatrix(const uint16_t* a, const uint16_t* b, float* d);

// One warp: `rows` rows of 8 16-bit elements staged in shared memory; lane l
// gives the address of row row_of_lane[l] to ldmatrix_x4 and then to
// ldmatrix_x4_trans. out[lane * 8 + m] is register m of the plain load,
// out[lane * 8 + 4 + m] of the transposed one.
void ldmatrix_rows(const uint16_t* matrix, int rows, const int* row_of_lane, uint32_t* out);

// Broken kernels.
void mma_by_half_a_warp(float* out);          // lanes 16-31 return before the mma
void mma_in_a_partial_warp(float* out);       // a block of 16 threads
void mma_at_two_sites(float* out);            // lanes 0-15 and 16-31 reach different mma calls
void ldmatrix_from_device_memory(const uint16_t* matrix, uint32_t* out);  // a global address
void ldmatrix_misaligned(uint32_t* out);      // rows 8 bytes off 16-byte alignment
// Each lane writes one shared row, then ldmatrix reads its neighbour's: a
// race unless `syncwarp` puts a __syncwarp between the two.
void ldmatrix_after_neighbour_writes(uint32_t* out, bool syncwarp);

}  // namespace mma_kernels
