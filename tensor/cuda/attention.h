// Host entry points of the causal attention kernels (tensor/cuda/attention.cu):
// the forward, and the backward's three launches (row dots, key gradients,
// query gradients). Operands are checked by the kernel table's adapters:
// q, k, v, out and the gradients [B, H, T, D] in one dtype (f32, f64 or
// bf16) with contiguous rows of D (any batch, head and row strides: views of
// a packed projection, or the [B, T, H, D] order); logsumexp and delta
// [B, H, T] contiguous in the accumulation dtype. bf16 operands of head dim
// 64 or 128 run on tensor cores (attention_mma.h), the rest on CUDA cores.
#pragma once

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

// The largest head dim the kernels take (GPT-2 uses 64).
constexpr int64_t kMaxAttentionHeadDim = 128;

// One head is [seq, dim]; there are `heads` of them (B * H), in batches of
// heads_per_batch (H).
struct AttentionShape {
  int64_t heads = 0;
  int32_t heads_per_batch = 1;
  int32_t seq = 0;
  int32_t dim = 0;
};

// How the kernels tile a head: a block owns `owned_rows` rows (query rows in
// the forward and for dQ, key rows for dK and dV) and streams the other side
// through shared memory `streamed_rows` rows at a time. Depends on the
// accumulation dtype and the head dim (bf16 at head dim 64 or 128: the
// tensor-core kernels', which take aligned operands; attention_mma.h); tests
// derive the bytes a launch should move from it.
struct AttentionTiling {
  int64_t owned_rows = 0;
  int64_t streamed_rows = 0;
};
AttentionTiling attention_tiling(DType dtype, int64_t head_dim);

// out = softmax(q k^T / sqrt(D) + causal mask) v, logsumexp = the log of each
// row's softmax denominator (max included), kept for the backward.
void causal_attention(const Operand& out, const Operand& logsumexp, const Operand& q, const Operand& k,
                      const Operand& v, const AttentionShape& shape, const KernelLaunch& launch);

// The backward, in three launches on one stream:
// delta[i] = grad_out[i] . out[i], the softmax backward's row term;
void attention_row_dots(const Operand& delta, const Operand& grad_out, const Operand& out,
                        const AttentionShape& shape, const KernelLaunch& launch);
// grad_k, grad_v: a block owns a key tile and loops over the query tiles that see it;
// grad_q: a block owns a query tile and loops over the key tiles it sees.
// score_grads: with data, the tensor-core kernels hand dS from the first to
// the second through it (attention_mma.h: the caller allocates it where
// attention_on_tensor_cores takes every operand of the backward and
// attention_hands_over_scores); without, each kernel runs on tensor cores
// where they take its operands, else on CUDA cores, recomputing the scores.
void attention_key_grads(const Operand& grad_k, const Operand& grad_v, const Operand& score_grads,
                         const Operand& grad_out, const Operand& q, const Operand& k, const Operand& v,
                         const Operand& logsumexp, const Operand& delta, const AttentionShape& shape,
                         const KernelLaunch& launch);
void attention_query_grads(const Operand& grad_q, const Operand& score_grads, const Operand& grad_out,
                           const Operand& q, const Operand& k, const Operand& v, const Operand& logsumexp,
                           const Operand& delta, const AttentionShape& shape, const KernelLaunch& launch);

}  // namespace tessera::cuda
