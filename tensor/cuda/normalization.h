// Host entry points of the layer/RMS norm kernels (tensor/cuda/normalization.cu):
// rows of contiguous [rows, cols] operands, f32, f64 or bf16 (bf16 computes
// in f32); the statistics (mean, rstd) and the workspace are in the
// arithmetic type (f32, or f64 for f64 rows). An undefined operand (null
// data) is one the op does not have: no mean for RMS norm, no weight or bias.
#pragma once

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

// The longest row the norm kernels take: a row lives in registers, 8 values
// a thread in a block of 512 (16 would spill f64 rows).
constexpr int64_t kNormMaxColumns = 4096;

// y = (x - mean) * rstd * weight + bias per row, writing mean and rstd [rows].
// With delta (add_norm; else null, and sum too), the row normalised is
// x + delta rounded to the row dtype, which is written to sum.
void norm(const Operand& y, const Operand& mean, const Operand& rstd, const Operand& sum, const Operand& x,
          const Operand& delta, const Operand& weight, const Operand& bias, double eps, int64_t rows, int64_t cols,
          const KernelLaunch& launch);

// The workspace norm_backward needs for the weight and bias gradients of
// [rows, cols] rows of dtype, in elements of the arithmetic type:
// [blocks, 2, cols] per-block partial sums.
int64_t norm_backward_workspace_elements(DType dtype, int64_t rows, int64_t cols);

// grad_x, and grad_weight/grad_bias (either may be undefined) summed over
// rows: each block sums its rows into the workspace, then one kernel adds
// the blocks' partials in block order (no atomics: the same bits every run).
// With grad_residual (norm_backward_add; else null), grad_x is the norm's
// gradient rounded to the row dtype plus grad_residual, rounded again.
void norm_backward(const Operand& grad_x, const Operand& grad_weight, const Operand& grad_bias,
                   const Operand& workspace, const Operand& grad_residual, const Operand& grad_y, const Operand& x,
                   const Operand& weight, const Operand& mean, const Operand& rstd, int64_t rows, int64_t cols,
                   const KernelLaunch& launch);

}  // namespace tessera::cuda
