// One GEMM, out = A B, on a given backend: the engine under cpu::matmul,
// which works out layouts and batches, reads gemm_backend() once (outside
// any parallel region: reading TESSERA_GEMM may throw) and calls this per
// matrix product.
#pragma once

#include <cstdint>

#include "tensor/gemm_backend.h"

namespace tessera::cpu {

// An [rows, cols] operand in memory: row-major (row r starts at data + r *
// leading) or column-major (column c starts at data + c * leading).
template <typename T>
struct GemmMatrix {
  const T* data;
  bool col_major;
  int64_t leading;
};

// out [m, n] (row-major, rows n apart) = a [m, k] @ b [k, n]; k >= 1.
// T is float or double. Products too large for CBLAS's int sizes run on Eigen.
template <typename T>
void gemm(GemmBackend backend, int64_t m, int64_t n, int64_t k, GemmMatrix<T> a, GemmMatrix<T> b, T* out);

}  // namespace tessera::cpu
