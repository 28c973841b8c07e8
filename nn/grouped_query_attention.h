// nn::GroupedQueryAttention: causal self-attention with separate q, k, v and
// output projections, fewer key/value heads than query heads (GQA,
// Ainslie et al. 2023), and optional rotary positions (Llama's attention).
//   x: [B, T, C] -> q = wq(x): [B, T, H, D], k = wk(x), v = wv(x): [B, T, Hkv, D]
//   -> RoPE on q and k -> each kv head serves H / Hkv query heads (query head j
//   reads kv head j / (H / Hkv)) -> causal attention [B, H, T, D]
//   -> merge heads [B, T, H*D] -> wo: [B, T, C].
// Hkv = H is multi-head attention; Hkv = 1 is multi-query attention.
// forward_cached: the same for a KVCache step's new tokens (nn/kv_cache.h),
// RoPE at their positions; the cache holds Hkv heads, not H.
#pragma once

#include <memory>
#include <optional>

#include "nn/kv_cache.h"
#include "nn/linear.h"
#include "nn/rotary_embedding.h"

namespace tessera::nn {

struct GroupedQueryAttentionOptions {
  int64_t num_kv_heads = 0;  // 0: num_heads (plain multi-head attention)
  struct Rope {
    int64_t max_seq_len;
    double theta = 10000.0;
  };
  std::optional<Rope> rope = std::nullopt;  // unset: no position information here
  bool bias = false;
  // Unset: Linear's default init; set: N(0, std), zero bias.
  std::optional<double> init_std = std::nullopt;
  std::optional<double> out_init_std = std::nullopt;  // wo's std; unset: init_std
  Device device = kCPU;
  DType dtype = DType::f32;
};

class GroupedQueryAttention : public Module {
 public:
  // Children: wq (C -> H*D), wk and wv (C -> Hkv*D), wo (H*D -> C), and
  // rope when set. D = embed_dim / num_heads; num_kv_heads divides num_heads.
  GroupedQueryAttention(int64_t embed_dim, int64_t num_heads, GroupedQueryAttentionOptions options = {});

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;
  // The step's new tokens x: [B, T, C] -> [B, T, C], attending over layer
  // `layer` of the cache (their keys and values stored into it first).
  Tensor forward_cached(const Tensor& x, KVCache& cache, int64_t layer, const CachedStep& step);

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return embed_dim_ / num_heads_; }
  // The query and key/value heads this rank computes, read from wq's and
  // wk's weights: all of them, or a tensor-parallel piece's share (tp's
  // Llama plan gives each rank whole heads of both, a kv head with the
  // query heads that read it).
  int64_t local_heads() const;
  int64_t local_kv_heads() const;
  Linear& wq() const { return *wq_; }
  Linear& wk() const { return *wk_; }
  Linear& wv() const { return *wv_; }
  Linear& wo() const { return *wo_; }
  RotaryEmbedding* rope() const { return rope_.get(); }  // null without

 private:
  struct Heads {
    Tensor q;  // [B, T, H, D]
    Tensor k;  // [B, T, Hkv, D]
    Tensor v;  // [B, T, Hkv, D]
  };
  // The projections of x [B, T, embed_dim] as heads (views), x checked first.
  Heads project_heads(const Tensor& x) const;
  // [B, T, Hkv, D] -> [B, H, T, D], each kv head repeated H / Hkv times in place.
  Tensor expand_kv_heads(const Tensor& kv) const;
  // Causal attention of all T queries over the T keys: [B, T, H, D].
  Tensor attend_causally(const Heads& heads) const;

  int64_t embed_dim_;
  int64_t num_heads_;
  int64_t num_kv_heads_;
  std::shared_ptr<Linear> wq_;
  std::shared_ptr<Linear> wk_;
  std::shared_ptr<Linear> wv_;
  std::shared_ptr<Linear> wo_;
  std::shared_ptr<RotaryEmbedding> rope_;
};

}  // namespace tessera::nn
