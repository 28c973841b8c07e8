// Host entry points of the gather and scatter-add kernels
// (tensor/cuda/indexing.cu). Operands are contiguous and viewed as
// [outer, size, inner] around the indexed dim, as on the cpu.
#pragma once

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

struct IndexGeometry {
  int64_t outer = 1;  // product of the dims before the indexed one
  int64_t inner = 1;  // product of the dims after it
  int64_t size = 0;   // the indexed dim's size in the indexed tensor (x, or out for index_add)
  int64_t count = 0;  // number of indices
};

// out [outer, count, inner] = x [outer, size, inner] at rows index[j].
void index_select(const Operand& out, const Operand& x, const Operand& index, const IndexGeometry& geometry,
                  const KernelLaunch& launch);
// out [outer, size, inner] += source [outer, count, inner] at rows index[i].
// Each thread owns one (outer, inner) column and adds the indices in order:
// duplicates accumulate without atomics, in the cpu's order, so the result
// is the cpu's bit for bit and the same on every run.
void index_add(const Operand& out, const Operand& index, const Operand& source, const IndexGeometry& geometry,
               const KernelLaunch& launch);

}  // namespace tessera::cuda
