// Host entry points of the reduction kernels (tensor/cuda/reduction.cu).
#pragma once

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

// Which elements of x each output reduces: outputs walk the kept dims in
// row-major order, each reducing over the reduced dims (sizes, x strides).
struct ReduceGeometry {
  Layout kept;
  Layout reduced;
  int64_t outputs = 0;
  int64_t reduced_count = 0;
};

// The f64-sized slots (each holds one accumulator) reduce needs in its
// workspace for `geometry`: the chunk partials of a column reduction (x as
// [rows, cols] summed over rows), 0 for other shapes.
int64_t reduce_workspace_elements(const ReduceGeometry& geometry);
// out (contiguous, keepdim shape) = sum, max or min of x, as the cpu
// computes it: floats sum in f64 and integers in i64 (wrapping), max and min
// propagate NaN. Fixed trees and chunk orders: the same bits on every run.
// workspace: reduce_workspace_elements(geometry) f64 slots, read and written.
void reduce(ReduceOp op, const Operand& out, const Operand& workspace, const Operand& x,
            const ReduceGeometry& geometry, const KernelLaunch& launch);
// values, indices (i64), both contiguous: the maximum of `length` elements
// `step` apart from x at first.layout.offset(o), and its first index (the
// first NaN wins, as on the cpu).
void max_along(const Operand& values, const Operand& indices, const Operand& first, int64_t length, int64_t step,
               const KernelLaunch& launch);

}  // namespace tessera::cuda
