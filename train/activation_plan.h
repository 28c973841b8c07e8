// The activations a rank holds for backward once its forward is done, from
// the model's shape: the figure activation checkpointing changes, which the
// run plan adds to the parameters' and optimizer's memory. FSDP shards
// parameters, never activations, so it holds at any world size.
//
// Per token of the micro-batch (e: the parameters' dtype, which activations
// follow; statistics in its compute dtype, written 4 below as for f32 and
// bf16; H heads, C width, F SwiGLU width, Vp the padded
// vocabulary):
//   GPT block     16 C e + (4 + H) 4        (+ 2 C e for the dropout masks)
//     ln1's output, qkv (3C), attention's output (the merged heads are its
//     view) and log-sum-exp, the residual sum and ln2's output with both
//     norms' mean and rstd, the MLP's pre-activation and GELU (4C each), and
//     the block's output;
//   Llama block   (8 C + 4 F) e + (2 + H) 4     (one key/value head: (6 C + 2 D + 4 F) e + ...)
//     the attention norm's output, rotated q, k and v with each key/value head
//     repeated for its query heads (a copy, H D = C each, unless there is one
//     key/value head: then a view of its D values), attention's output and
//     log-sum-exp, the residual sum, the FFN norm's output (both rstd), the
//     SwiGLU's w1 and w3 products, SiLU's output and the gated product, and
//     the block's output;
//   checkpointed  C e: its output, which the next block keeps as its input;
//   selective     also the products the replay takes (autograd/recompute_memo.h):
//     GPT     7 C e + H 4: qkv (3C), attention's output and log-sum-exp, its
//             projection and the MLP's second product;
//     Llama   (5 C + 2 K + 2 F) e + H 4, K = n_kv_head D: the products of wq,
//             wk and wv (before any repeat), attention's output and
//             log-sum-exp, and those of wo, w1, w3 and w2;
//   outside the blocks: the embedding's output (GPT: with dropout also its
//     mask), the final norm's output and statistics, the logits (Vp e) and
//     the loss's log-sum-exp; per sequence GPT's position ids (8 T bytes);
//     the loss itself.
//   LoRA (--lora r, train/lora_fine_tuning.h), a block also keeps each
//     adapter's x A^T (GPT 4 r e, Llama 7 r e); selective also each adapter's
//     two products (r + its output width) and, GPT's MLP running unfused, its
//     first product (4 C). The frozen embedding's output needs no gradient:
//     the first block's norm records nothing, so its statistics (GPT 2, Llama
//     1) are not held, nor the embedding's output unless a checkpoint keeps it
//     as the first block's input, nor GPT's dropout mask and position ids;
//     and the frozen head keeps no input (the final norm's output, C e).
// Checked exactly against the allocator in tests/train/test_activation_plan.cpp;
// bench/activation_memory measures GPT-2 124M and Llama beside it.
#pragma once

#include <cstdint>

#include "nn/activation_checkpoint.h"
#include "tensor/dtype.h"
#include "train/model_family.h"
#include "train/train_config.h"

namespace tessera::train {

struct ActivationShape {
  int64_t batch = 1;    // sequences of the micro-batch
  int64_t seq_len = 1;  // T
  DType dtype = DType::f32;  // what the blocks compute in (FSDP's param_dtype)
  tessera::nn::ActivationCheckpointPolicy checkpointing = {};
  int64_t lora_rank = 0;  // train --lora: adapters on the block projections, everything else frozen
};

struct ActivationBytes {
  int64_t block = 0;               // one block that is not checkpointed
  int64_t checkpointed_block = 0;  // one that is (fully or selectively, as the policy says)
  int64_t outside_blocks = 0;      // embedding, final norm, logits, loss
  int64_t total = 0;               // what the whole model holds under the policy
};

// A model without tensor parallelism.
ActivationBytes plan_activations(const ModelConfig& config, const ActivationShape& shape);
inline int64_t plan_activation_bytes(const ModelConfig& config, const ActivationShape& shape) {
  return plan_activations(config, shape).total;
}
// A run's: its model, --batch, --seq-len, --param-dtype and --ac.
ActivationBytes plan_activations(const TrainConfig& config);
// How many of the run's blocks its --ac checkpoints.
int64_t checkpointed_blocks(const TrainConfig& config);

}  // namespace tessera::train
