// nn::GPT: a GPT-2 style decoder-only transformer with a tied output head.
//   idx: [B, T] -> wte(idx) + wpe(0..T-1) -> dropout -> blocks -> ln_f
//   -> logits = lm_head(x) = x @ wte^T: [B, T, Vp]  (lm_head is a TiedLinear
//      holding wte's Parameter: no copy, and the tie is visible to fsdp)
//   loss = cross_entropy(logits: [B*T, Vp], targets: [B*T], V classes)   (nn::CausalLM)
// forward_cached (nn::CausalLM): wpe at the new tokens' positions, each
// block's attention over its layer of the KVCache.
// Vp = config.padded_vocab_size(): wte's rows past V are zero padding that
// only aligns the head's GEMMs (GPTConfig::vocab_padding_multiple).
// Parameter names: wte.weight, wpe.weight, blocks.{i}.{ln1,attn.qkv,attn.proj,
// ln2,mlp.fc,mlp.proj}.{weight,bias}, ln_f.{weight,bias}; lm_head.weight is
// wte.weight (listed once by named_parameters, under both names in state_dict).
// GPT-2 init: N(0, 0.02) for Linear and Embedding weights, zero biases, unit
// norm weights, N(0, 0.02 / sqrt(2 * n_layer)) for attn.proj and mlp.proj.
#pragma once

#include <memory>

#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/models/causal_lm.h"
#include "nn/models/gpt_config.h"
#include "nn/normalization.h"
#include "nn/tied_linear.h"
#include "nn/transformer_block.h"

namespace tessera::nn {

class GPT : public CausalLM {
 public:
  // On meta nothing is allocated (build, shard, then to_empty +
  // reset_parameters); on a real device the model is initialised with
  // init::next_seed() from the thread's default generator.
  explicit GPT(const GPTConfig& config, Device device = kCPU);

  const GPTConfig& config() const { return config_; }
  ModuleList& blocks() const override { return *blocks_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t padded_vocab_size() const override { return config_.padded_vocab_size(); }
  int64_t block_size() const override { return config_.block_size; }
  KVCacheLayout kv_cache_layout() const override;
  Embedding& wte() const { return *wte_; }
  Embedding& wpe() const { return *wpe_; }
  TransformerBlock& block(int64_t index) const;
  LayerNorm& ln_f() const { return *ln_f_; }
  TiedLinear& lm_head() const { return *lm_head_; }

 protected:
  Tensor logits(const Tensor& idx) override;
  Tensor cached_logits(const Tensor& idx, KVCache& cache, const CachedStep& step, bool last_only) override;

 private:
  GPTConfig config_;
  std::shared_ptr<Embedding> wte_;
  std::shared_ptr<Embedding> wpe_;
  std::shared_ptr<Dropout> drop_;
  std::shared_ptr<ModuleList> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<TiedLinear> lm_head_;
};

}  // namespace tessera::nn
