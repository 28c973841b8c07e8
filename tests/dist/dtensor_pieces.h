// What the DTensor tests compare pieces with: a piece cut from the whole
// tensor, and bit-for-bit equality (shape, dtype and bytes).
#pragma once

#include <cstring>

#include "dist/dtensor.h"
#include "tensor/ops.h"

namespace tessera::testing {

// The slice of `full` that `piece` describes, contiguous.
inline Tensor slice_of(const Tensor& full, const dist::LocalPiece& piece) {
  Tensor slice = full;
  for (int64_t d = 0; d < full.dim(); ++d) slice = ops::narrow(slice, d, piece.offset[d], piece.shape[d]);
  return ops::contiguous(slice);
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor x = ops::contiguous(a);
  const Tensor y = ops::contiguous(b);
  return x.nbytes() == 0 || std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0;
}

}  // namespace tessera::testing
