// Tensor-parallel plans for tessera's decoder models, with sequence
// parallelism and loss parallel (Megatron-LM's layout, as torchtitan applies
// it to Llama):
//   the token embedding is vocabulary-parallel, its output sequence-sharded;
//   norms (and their inputs and outputs) stay sequence-sharded [B, T/tp, C];
//   attention and the MLP gather the sequence on entry (all-gather; its
//   backward a reduce-scatter), run column-wise projections on whole heads,
//   and leave through a row-wise projection whose partial sums are
//   reduce-scattered back onto the sequence;
//   the head is column-wise: each rank computes its vocabulary columns of the
//   logits, and the loss runs on them (tp/loss_parallel.h), never gathering
//   them.
// Per block and step that is two all-gathers and two reduce-scatters of
// [B, T, C] activations forward, and the same backward.
#pragma once

#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "tp/parallelize.h"

namespace tessera::tp {

struct PlanOptions {
  // Async tensor parallelism (tp/collective_matmul.h): 0 moves activations
  // whole; k >= 1 fuses each sequence all-gather into the column-wise product
  // after it and each reduce-scatter into the row-wise product before it, in
  // k batch chunks that overlap the GEMMs. GPT: qkv and mlp.fc gather their
  // own input, attn.proj and mlp.proj scatter; Llama: attention's and
  // feed_forward's one gather feeds wq, wk and wv, and w1 and w3
  // (gather_sequence_into), wo and w2 scatter.
  int64_t async_chunks = 0;
};

// GPT: wte vocabulary-parallel and, tied to it, lm_head column-wise (one
// piece of rows serves both); wpe replicated, each rank taking its positions'
// rows of the output; the fused qkv column-wise in 3 sections (each rank
// takes its heads' rows of q, k and v), attn.proj and mlp.proj row-wise,
// mlp.fc column-wise; the dropouts (after the embeddings, attention and the
// MLP, all on sequence-sharded activations) each draw their slice of the
// 1-rank mask, given the same generator state on every tp rank.
ParallelizePlan gpt_plan(const PlanOptions& options = {});
// Llama: tok_embeddings vocabulary-parallel; wq, wk, wv, w1 and w3
// column-wise, wo and w2 row-wise; output column-wise.
ParallelizePlan llama_plan(const PlanOptions& options = {});

// Checks that the model can be split over `tp_mesh` (its size divides
// n_head and, for Llama, n_kv_head), applies its plan and
// installs the loss over vocabulary shards. Refusals name the numbers. The
// sequence length of every call must then divide by the tp size.
void parallelize_gpt(nn::GPT& model, const dist::DeviceMesh& tp_mesh, const PlanOptions& options = {});
void parallelize_llama(nn::Llama& model, const dist::DeviceMesh& tp_mesh, const PlanOptions& options = {});
// Either of the above, by the model's type.
void parallelize_causal_lm(nn::CausalLM& model, const dist::DeviceMesh& tp_mesh, const PlanOptions& options = {});

}  // namespace tessera::tp
