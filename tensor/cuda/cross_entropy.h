// Host entry points of the fused cross-entropy kernels
// (tensor/cuda/cross_entropy.cu): logits [rows, columns] contiguous in f32,
// f64 or bf16 (bf16 computes in f32), of which the first `classes` columns
// are classes and the rest padding (a padded vocabulary: outside the
// softmax, zero gradient); targets [rows] i32 or i64 with ignore_index
// marking rows left out of the mean. logsumexp [rows] and the
// workspaces are in the arithmetic type (f32, or f64 for f64 logits).
#pragma once

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

// loss (0-d) = mean over kept rows of logsumexp[n] - logits[n, target[n]],
// writing logsumexp of every row for the backward. row_losses: a [rows]
// workspace; the mean is one block's fixed tree over it (in f64), so the loss
// never leaves the device and is the same bits on every run.
void cross_entropy(const Operand& loss, const Operand& logsumexp, const Operand& row_losses, const Operand& logits,
                   const Operand& targets, int64_t ignore_index, int64_t rows, int64_t classes, int64_t columns,
                   const KernelLaunch& launch);

// grad_logits = grad_loss / kept * (exp(logits - logsumexp) - onehot(target)),
// zero on ignored rows and padding columns: the logits read once, the
// gradient written once.
// scale: a one-element workspace for grad_loss / kept (grad_loss: one value,
// in the arithmetic type).
void cross_entropy_backward(const Operand& grad_logits, const Operand& grad_loss, const Operand& scale,
                            const Operand& logits, const Operand& logsumexp, const Operand& targets,
                            int64_t ignore_index, int64_t rows, int64_t classes, int64_t columns,
                            const KernelLaunch& launch);

}  // namespace tessera::cuda
