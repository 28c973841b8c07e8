// Loss parallel: the mean cross-entropy of logits sharded on the class
// (vocabulary) dim over a tensor-parallel group, computed without gathering
// the logits. Each rank holds the columns [offset, offset + local) of the
// C classes that ceil-chunking gives it (dist::shard_extent, as a
// column-wise head leaves them), and every rank holds all the targets.
// Three all-reduces of one value a row make the loss:
//   max over the ranks' row maxima              (so that exp cannot overflow)
//   sum over the ranks of sum(exp(x - max))     (the softmax's denominator)
//   sum over the ranks of the target's logit    (held by one rank, 0 elsewhere)
//   loss_row = log(sum) + max - target logit, averaged over rows whose target
//   is not ignore_index.
// The gradient of each rank's columns is (softmax - one-hot) / kept rows, from
// what the forward kept: no communication in the backward. Every rank gets
// the same loss.
#pragma once

#include "dist/process_group.h"
#include "tensor/tensor.h"

namespace tessera::tp {

// local_logits: [N, local], floating (bf16 and f16 computed on in f32, the
// loss f32 and the gradient in their dtype), this rank's columns of [N, columns],
// columns = padded_classes (0: classes); the columns past `classes` are
// padding (a padded vocabulary, as nn::GPT's head has) and take no part;
// targets: [N] i32 or i64 in [0, classes) or ignore_index, equal on every
// rank. Collective over `group` (all its ranks call it). Returns the 0-d
// loss, differentiable in local_logits; NaN when every row is ignored (a
// mean over no rows). The targets are read on the host to be checked (a
// device sync on a GPU).
Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    const dist::ProcessGroupPtr& group, int64_t classes, int64_t ignore_index = -100,
                                    int64_t padded_classes = 0);

}  // namespace tessera::tp
