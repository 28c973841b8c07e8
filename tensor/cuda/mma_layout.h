// The register layout of the warp-level tensor-core instructions in
// tensor/cuda/mma.h: which elements of A, B, C and D each lane holds. Plain
// functions, for kernels (to place what they load and store) and for host
// code and tests alike.
//
// Register layouts: PTX ISA 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16
// with floating point type" and 9.7.14.5.15 "ldmatrix"
// (https://docs.nvidia.com/cuda/parallel-thread-execution/
// #warp-level-matrix-fragment-mma-16816-float). With
//   g = laneid >> 2 (groupID), t = laneid % 4 (threadID_in_group),
// and element e of a fragment held in register e / 2, in its low 16 bits
// when e is even (a .b32 register holds two 16-bit elements, low first):
//   A (16x16, row):  a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//                    a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B (16x8, col):   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   C, D (16x8 f32): c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// (mma_a_position, mma_b_position and mma_accumulator_position say the same
// in code.) ldmatrix .x4: lane l gives the address of row l % 8 of matrix
// l / 8 (16 bytes, 16-byte aligned, in shared memory; rows need not be
// contiguous); register m of lane l receives row g, elements 2t and 2t+1 of
// matrix m, or with .trans elements [2t][g] and [2t+1][g] (the matrix read
// column-major). So ldmatrix_x4 of the four 8x8 quarters of a row-major
// 16x16 tile (rows 0-7 cols 0-7, rows 8-15 cols 0-7, rows 0-7 cols 8-15,
// rows 8-15 cols 8-15) gives mma's A fragment, and ldmatrix_x4_trans of a
// row-major [k][n] tile gives B fragments.
#pragma once

#include "tensor/host_device.h"

namespace tessera::cuda {

// Where element `element` of a lane's fragment lies in its matrix.
struct FragmentPosition {
  int row;
  int col;
};

// A: elements 0-7 (register element / 2).
TESSERA_HOST_DEVICE constexpr FragmentPosition mma_a_position(int lane, int element) {
  const int group = lane >> 2, in_group = lane % 4;
  const int row = group + ((element & 2) != 0 ? 8 : 0);
  const int col = in_group * 2 + (element & 1) + (element >= 4 ? 8 : 0);
  return {row, col};
}

// B: elements 0-3 (register element / 2); row is k, col is n.
TESSERA_HOST_DEVICE constexpr FragmentPosition mma_b_position(int lane, int element) {
  return {(lane % 4) * 2 + (element & 1) + (element >= 2 ? 8 : 0), lane >> 2};
}

// C and D: elements 0-3, one f32 register each.
TESSERA_HOST_DEVICE constexpr FragmentPosition mma_accumulator_position(int lane, int element) {
  return {(lane >> 2) + (element >= 2 ? 8 : 0), (lane % 4) * 2 + (element & 1)};
}

}  // namespace tessera::cuda
