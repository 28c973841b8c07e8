// Host entry points of the gather and scatter-add kernels
// (tensor/cuda/indexing.cu). Operands are contiguous and viewed as
// [outer, size, inner] around the indexed dim, as on the cpu.
#pragma once

#include "tensor/cuda/deferred_errors.h"
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

// Keys index_add_rows sorts: a power of two, at least a sort tile.
int64_t sort_key_capacity(int64_t count);
// The embedding backward: out [size, inner] += source [count, inner] at rows
// index[i] (outer == 1), parallel over tokens and columns. The keys
// (row << 32 | position, unique, so every correct sort yields the one order)
// are sorted on the device by a bitonic network in `keys`
// (sort_key_capacity(count) of them); then a block takes each run of one row
// and its threads add the run's source rows in position order across the
// columns. The cpu's order for duplicates, no atomics: the cpu's bits.
// f32 or f64; needs size and count below 2^31.
void index_add_rows(const Operand& out, const Operand& index, const Operand& source, const IndexGeometry& geometry,
                    uint64_t* keys, const KernelLaunch& launch);

// Writes to `record` (check id `check`) the first value of `indices`
// (contiguous i32/i64) outside [0, count) and not also_allowed (when
// has_allowed). The gather and scatter kernels skip such values, so a bad
// index never touches memory before the host raises it.
void check_index_range(const Operand& indices, int64_t count, bool has_allowed, int64_t also_allowed,
                       DeviceErrorRecord* record, int64_t check, const KernelLaunch& launch);

}  // namespace tessera::cuda
