// What tensor parallelism sends: the collectives each tp rank issues for one
// micro-batch's forward and backward under the GPT or Llama plan
// (tp/plans.h), with the calls and bytes the tp group's stats count
// (dist::collective_volume), exactly, from the model's shape alone:
//   forward   the embedding's reduce-scatter onto the sequence; per block an
//             all-gather of [B, T, C] into attention and into the MLP and a
//             reduce-scatter out of each; the all-gather into the head; the
//             loss's 3 all-reduces of a value a row (f32, f64 for f64 logits);
//   async     (PlanOptions::async_chunks) the fused moves in batch chunks:
//             the same bytes, a call per chunk (all four moves of a block,
//             GPT's and Llama's);
//   recompute each block with activation checkpointing (nn/activation_checkpoint.h)
//             repeats its forward's moves during backward (counted there);
//   backward  the conjugates: per block 2 reduce-scatters and 2 all-gathers,
//             the head's reduce-scatter, the embedding's all-gather (and GPT's
//             position rows' all-gather of [T, C]); then one all-reduce per
//             parameter with partial gradients, unless FSDP shards it (FSDP
//             then sums the shards, in its own plan's groups).
#pragma once

#include <cstdint>

#include "dist/comm_stats.h"
#include "nn/models/causal_lm.h"

namespace tessera::tp {

struct TrafficShape {
  int64_t batch = 1;    // B, one micro-batch per tp group
  int64_t seq_len = 1;  // T, divisible by the tp size
  DType activation_dtype = DType::f32;  // what the blocks compute in (FSDP's param_dtype)
  bool fsdp_sums_partial_gradients = false;
  int64_t async_chunks = 0;  // the plan's PlanOptions::async_chunks
};

struct TensorParallelTraffic {
  dist::CommStats forward;
  dist::CommStats backward;
};

// `model`: a GPT or Llama that tp/plans.h parallelized (its pieces say the tp
// size and which parameters have partial gradients; meta is fine).
TensorParallelTraffic plan_traffic(const nn::CausalLM& model, const TrafficShape& shape);

}  // namespace tessera::tp
