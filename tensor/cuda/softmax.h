// Host entry points of the softmax kernels (tensor/cuda/softmax.cu): row-wise
// over the last dim of contiguous [rows, cols] operands, f32, f64 or bf16
// (bf16 computes in f32).
#pragma once

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

// out = softmax(x) (or log_softmax) of each row.
void softmax(const Operand& out, const Operand& x, int64_t rows, int64_t cols, bool log, const KernelLaunch& launch);
// grad_in from grad_out and the forward's output y (p, or log p when `log`).
void softmax_backward(const Operand& grad_in, const Operand& grad_out, const Operand& y, int64_t rows, int64_t cols,
                      bool log, const KernelLaunch& launch);

}  // namespace tessera::cuda
