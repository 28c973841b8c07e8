// nn::CausalSelfAttention: multi-head causal self-attention with one fused
// input projection (GPT-2's layout).
//   x: [B, T, C] -> qkv Linear [B, T, 3C] -> q, k, v: [B, H, T, D] ->
//   causal scaled-dot-product attention -> merge heads [B, T, C] -> proj
//   Linear -> dropout. (Dropout applies to the output only, not the attention
//   weights.)
// forward_cached: the same for a KVCache step's new tokens (nn/kv_cache.h).
// Under tensor parallelism (tp's GPT plan) qkv holds this rank's heads'
// rows of q, k and v and proj the matching columns: forward computes those
// heads alone (local_heads()), and proj's partial products are summed by its
// style. forward_cached runs without tensor parallelism.
// For separate projections, fewer key/value heads or rotary positions see
// nn::GroupedQueryAttention.
#pragma once

#include <memory>
#include <optional>

#include "nn/dropout.h"
#include "nn/kv_cache.h"
#include "nn/linear.h"

namespace tessera::nn {

struct AttentionOptions {
  bool bias = true;
  // Unset: Linear's default init; set: N(0, std), zero bias.
  std::optional<double> init_std = std::nullopt;
  // proj's std when set (GPT-2: 0.02 / sqrt(2 L)); unset: init_std.
  std::optional<double> proj_init_std = std::nullopt;
  double dropout = 0.0;  // on the output
  Device device = kCPU;
  DType dtype = DType::f32;
};

class CausalSelfAttention : public Module {
 public:
  // Children: qkv (C -> 3C), proj (C -> C), drop. embed_dim C must be a
  // multiple of num_heads H.
  CausalSelfAttention(int64_t embed_dim, int64_t num_heads, AttentionOptions options = {});

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;
  // The step's new tokens x: [B, T, C] -> [B, T, C], attending over layer
  // `layer` of the cache (their keys and values stored into it first).
  Tensor forward_cached(const Tensor& x, KVCache& cache, int64_t layer, const CachedStep& step);

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  // The heads this rank computes, read from qkv's weight: num_heads(), or a
  // tensor-parallel piece's share of them.
  int64_t local_heads() const;
  Linear& qkv() const { return *qkv_; }
  Linear& proj() const { return *proj_; }

 private:
  void check_input(const Tensor& x) const;

  int64_t embed_dim_;
  int64_t num_heads_;
  std::shared_ptr<Linear> qkv_;
  std::shared_ptr<Linear> proj_;
  std::shared_ptr<Dropout> drop_;
};

}  // namespace tessera::nn
