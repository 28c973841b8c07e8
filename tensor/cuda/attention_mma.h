// Causal attention on tensor cores (tensor/cuda/attention_mma.cu): bf16 q, k
// and v, head dim 64 or 128, f32 accumulation and f32 softmax statistics. The
// same operands, outputs and saved log-sum-exp as the CUDA-core kernels of
// tensor/cuda/attention.h, whose entry points route here when
// attention_on_tensor_cores says these kernels take the operands.
#pragma once

#include <initializer_list>

#include "tensor/cuda/attention.h"

namespace tessera::cuda {

// Rows a block owns (query rows in the forward and for dQ, key rows for dK
// and dV) and rows of the other side it stages per step: 64 each, 16 per warp.
constexpr int64_t kAttentionMmaTile = 64;

// Whether the tensor-core kernels take these operands: bf16, head dim 64 or
// 128, and each [B, H, T, D] operand (not the f32 statistics) 16-byte aligned
// with batch, head and row strides that are multiples of 8 elements, as the
// kernels move rows in 16-byte pieces. Anything else stays on CUDA cores.
bool attention_on_tensor_cores(const AttentionShape& shape, DType dtype,
                               std::initializer_list<const Operand*> operands);

// The forward: out and logsumexp as causal_attention writes them.
void causal_attention_mma(const Operand& out, const Operand& logsumexp, const Operand& q, const Operand& k,
                          const Operand& v, const AttentionShape& shape, const KernelLaunch& launch);

// The backward after attention_row_dots: grad_k and grad_v by key-tile
// blocks, then grad_q by query-tile blocks (as attention_key_grads and
// attention_query_grads). With score_grads (attention_score_grads_elements
// bf16 elements), the first kernel also writes every bf16 dS it forms there
// and the second reads them instead of recomputing S and dP: T^2 / 2 bytes a
// head, so only where attention_hands_over_scores (within the budget);
// without, dQ recomputes them in O(T) memory.
int64_t attention_score_grads_elements(const AttentionShape& shape);
// The most bytes of score_grads one backward call takes (1 GiB: GPT-2 at
// B = 64, T = 1024 takes 0.8; beyond it, long sequences recompute).
// Settable for tests.
constexpr int64_t kDefaultScoreGradsBudget = int64_t{1} << 30;
int64_t attention_score_grads_budget();
void set_attention_score_grads_budget(int64_t bytes);
bool attention_hands_over_scores(const AttentionShape& shape);
void attention_key_grads_mma(const Operand& grad_k, const Operand& grad_v, const Operand& score_grads,
                             const Operand& grad_out, const Operand& q, const Operand& k, const Operand& v,
                             const Operand& logsumexp, const Operand& delta, const AttentionShape& shape,
                             const KernelLaunch& launch);
void attention_query_grads_mma(const Operand& grad_q, const Operand& score_grads, const Operand& grad_out,
                               const Operand& q, const Operand& k, const Operand& v, const Operand& logsumexp,
                               const Operand& delta, const AttentionShape& shape, const KernelLaunch& launch);

}  // namespace tessera::cuda
