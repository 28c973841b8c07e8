// nn::Llama: a Llama-style decoder-only transformer (Touvron et al. 2023),
// what research groups train today:
//   idx: [B, T] -> tok_embeddings -> layers -> norm -> output: logits [B, T, V]
//   each LlamaBlock:  h = x + attention(attention_norm(x))
//                     out = h + feed_forward(ffn_norm(h))
// with RMSNorm, grouped-query attention with rotary positions (no position
// embedding table), a SwiGLU feed-forward and an untied output head; no biases.
// Parameter names follow Meta's reference and torchtitan:
//   tok_embeddings.weight, layers.{i}.attention_norm.weight,
//   layers.{i}.attention.{wq,wk,wv,wo}.weight, layers.{i}.ffn_norm.weight,
//   layers.{i}.feed_forward.{w1,w2,w3}.weight, norm.weight, output.weight.
// forward_cached (nn::CausalLM): RoPE at the new tokens' positions, each
// layer's attention over its layer of the KVCache (Hkv heads).
// Each attention holds its RoPE tables (non-persistent buffers, rebuilt by
// to_empty), so a block is a self-contained FSDP unit.
// Init (torchtitan's choices, untruncated): tok_embeddings N(0, 1); wq, wk,
// wv, w1, w3 N(0, 0.02); wo and w2 N(0, 0.02 / sqrt(2 L)); output
// N(0, 1/sqrt(C)); norm weights 1.
#pragma once

#include <memory>

#include "nn/embedding.h"
#include "nn/grouped_query_attention.h"
#include "nn/linear.h"
#include "nn/models/causal_lm.h"
#include "nn/models/llama_config.h"
#include "nn/normalization.h"
#include "nn/swiglu.h"

namespace tessera::nn {

class LlamaBlock : public Module {
 public:
  // Built on `device` like any layer (meta: nothing allocated).
  explicit LlamaBlock(const LlamaConfig& config, Device device = kCPU);

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;
  // The same for a KVCache step's new tokens, attention over layer `layer`
  // of the cache (nn/kv_cache.h).
  Tensor forward_cached(const Tensor& x, KVCache& cache, int64_t layer, const CachedStep& step);

  RMSNorm& attention_norm() const { return *attention_norm_; }
  GroupedQueryAttention& attention() const { return *attention_; }
  RMSNorm& ffn_norm() const { return *ffn_norm_; }
  SwiGLU& feed_forward() const { return *feed_forward_; }

 private:
  std::shared_ptr<RMSNorm> attention_norm_;
  std::shared_ptr<GroupedQueryAttention> attention_;
  std::shared_ptr<RMSNorm> ffn_norm_;
  std::shared_ptr<SwiGLU> feed_forward_;
};

class Llama : public CausalLM {
 public:
  // On meta nothing is allocated (build, shard, then to_empty +
  // reset_parameters); on a real device the model is initialised with
  // init::next_seed() from the thread's default generator.
  explicit Llama(const LlamaConfig& config, Device device = kCPU);

  const LlamaConfig& config() const { return config_; }
  ModuleList& blocks() const override { return *layers_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t block_size() const override { return config_.block_size; }
  KVCacheLayout kv_cache_layout() const override;
  Embedding& tok_embeddings() const { return *tok_embeddings_; }
  LlamaBlock& layer(int64_t index) const;
  RMSNorm& norm() const { return *norm_; }
  Linear& output() const { return *output_; }

 protected:
  Tensor logits(const Tensor& idx) override;
  Tensor cached_logits(const Tensor& idx, KVCache& cache, const CachedStep& step, bool last_only) override;

 private:
  LlamaConfig config_;
  std::shared_ptr<Embedding> tok_embeddings_;
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<RMSNorm> norm_;
  std::shared_ptr<Linear> output_;
};

}  // namespace tessera::nn
