// nn::GPT: embeddings, the block stack, final norm and the tied head.
#include "nn/models/gpt.h"

#include <cmath>

#include "autograd/functions.h"
#include "tensor/ops.h"

namespace tessera::nn {

GPT::GPT(const GPTConfig& config, Device device) : CausalLM("GPT"), config_(config) {
  config_.validate();
  const EmbeddingOptions embedding{.init_std = 0.02, .device = kMeta, .dtype = config_.dtype};
  EmbeddingOptions token_embedding = embedding;
  if (config_.padded_vocab_size() > config_.vocab_size) token_embedding.padding_rows_from = config_.vocab_size;
  wte_ = register_module("wte",
                         std::make_shared<Embedding>(config_.padded_vocab_size(), config_.n_embd, token_embedding));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(config_.block_size, config_.n_embd, embedding));
  drop_ = register_module("drop", std::make_shared<Dropout>(config_.dropout));
  blocks_ = register_module("blocks", std::make_shared<ModuleList>());
  // GPT-2 init: N(0, 0.02), the residual projections 0.02 / sqrt(2 L).
  const TransformerBlockOptions block{
      .bias = config_.bias,
      .dropout = config_.dropout,
      .norm_eps = config_.norm_eps,
      .init_std = 0.02,
      .residual_init_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer)),
      .device = kMeta,
      .dtype = config_.dtype};
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    blocks_->push_back(std::make_shared<TransformerBlock>(config_.n_embd, config_.n_head, block));
  }
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(
                                      config_.n_embd, LayerNormOptions{.eps = config_.norm_eps, .bias = config_.bias,
                                                                       .device = kMeta, .dtype = config_.dtype}));
  lm_head_ = register_module("lm_head", std::make_shared<TiedLinear>(wte_->parameter("weight")));
  materialize(device);
}

TransformerBlock& GPT::block(int64_t index) const {
  auto* block = dynamic_cast<TransformerBlock*>(&(*blocks_)[index]);
  TESSERA_CHECK(block != nullptr, "GPT: blocks.{} is a {}, not a TransformerBlock", index,
                (*blocks_)[index].type_name());
  return *block;
}

Tensor GPT::logits(const Tensor& idx) {
  const Tensor positions =
      ops::arange(0, static_cast<double>(idx.size(1)), 1, {.dtype = DType::i64, .device = idx.device()});
  // [B, T, C] + [T, C]
  Tensor x = tessera::add((*wte_)(idx), (*wpe_)(positions));
  x = (*drop_)(x);
  for (const auto& block : *blocks_) x = (*block)(x);
  x = (*ln_f_)(x);
  // Tied head: [B, T, C] x [Vp, C]^T -> [B, T, Vp] through wte's weight.
  return (*lm_head_)(x);
}

KVCacheLayout GPT::kv_cache_layout() const {
  return {.num_layers = config_.n_layer,
          .num_kv_heads = config_.n_head,
          .head_dim = config_.n_embd / config_.n_head,
          .dtype = config_.dtype};
}

Tensor GPT::cached_logits(const Tensor& idx, KVCache& cache, const CachedStep& step, bool last_only) {
  // [B, T, C] + [B, T, C]: each token's embedding at its own position.
  Tensor x = tessera::add((*wte_)(idx), (*wpe_)(step.positions));
  x = (*drop_)(x);
  for (int64_t i = 0; i < config_.n_layer; ++i) x = block(i).forward_cached(x, cache, i, step);
  if (last_only) x = tessera::narrow(x, 1, x.size(1) - 1, 1);  // [B, 1, C]
  return (*lm_head_)((*ln_f_)(x));
}

}  // namespace tessera::nn
