// nn::Llama and nn::LlamaBlock: the decoder stack from generic layers.
#include "nn/models/llama.h"

#include <cmath>

#include "autograd/functions.h"

namespace tessera::nn {

LlamaBlock::LlamaBlock(const LlamaConfig& config, Device device) : Module("LlamaBlock") {
  config.validate();
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  const RMSNormOptions norm{.eps = config.norm_eps, .device = kMeta, .dtype = config.dtype};
  attention_norm_ = register_module("attention_norm", std::make_shared<RMSNorm>(config.n_embd, norm));
  attention_ = register_module(
      "attention", std::make_shared<GroupedQueryAttention>(
                       config.n_embd, config.n_head,
                       GroupedQueryAttentionOptions{
                           .num_kv_heads = config.n_kv_head,
                           .rope = GroupedQueryAttentionOptions::Rope{.max_seq_len = config.block_size,
                                                                      .theta = config.rope_theta},
                           .bias = false,
                           .init_std = 0.02,
                           .out_init_std = residual_std,
                           .device = kMeta,
                           .dtype = config.dtype}));
  ffn_norm_ = register_module("ffn_norm", std::make_shared<RMSNorm>(config.n_embd, norm));
  feed_forward_ = register_module(
      "feed_forward", std::make_shared<SwiGLU>(config.n_embd, config.ffn_hidden,
                                               SwiGLUOptions{.bias = false, .init_std = 0.02,
                                                             .out_init_std = residual_std, .device = kMeta,
                                                             .dtype = config.dtype}));
  materialize(device);
}

Tensor LlamaBlock::forward(const Tensor& x) {
  const Tensor h = tessera::add(x, (*attention_)((*attention_norm_)(x)));  // [B, T, C]
  return tessera::add(h, (*feed_forward_)((*ffn_norm_)(h)));
}

Tensor LlamaBlock::forward_cached(const Tensor& x, KVCache& cache, int64_t layer, const CachedStep& step) {
  check_no_forward_hooks(*this, "LlamaBlock::forward_cached");
  const Tensor h = tessera::add(x, attention_->forward_cached((*attention_norm_)(x), cache, layer, step));
  return tessera::add(h, (*feed_forward_)((*ffn_norm_)(h)));
}

Llama::Llama(const LlamaConfig& config, Device device) : CausalLM("Llama"), config_(config) {
  config_.validate();
  tok_embeddings_ = register_module(
      "tok_embeddings", std::make_shared<Embedding>(config_.vocab_size, config_.n_embd,
                                                    EmbeddingOptions{.init_std = 1.0, .device = kMeta,
                                                                     .dtype = config_.dtype}));
  layers_ = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config_.n_layer; ++i) layers_->push_back(std::make_shared<LlamaBlock>(config_, kMeta));
  norm_ = register_module("norm", std::make_shared<RMSNorm>(
                                      config_.n_embd,
                                      RMSNormOptions{.eps = config_.norm_eps, .device = kMeta, .dtype = config_.dtype}));
  output_ = register_module(
      "output", std::make_shared<Linear>(config_.n_embd, config_.vocab_size,
                                         LinearOptions{.bias = false,
                                                       .init_std = 1.0 / std::sqrt(static_cast<double>(config_.n_embd)),
                                                       .device = kMeta, .dtype = config_.dtype}));
  materialize(device);
}

LlamaBlock& Llama::layer(int64_t index) const {
  auto* block = dynamic_cast<LlamaBlock*>(&(*layers_)[index]);
  TESSERA_CHECK(block != nullptr, "Llama: layers.{} is a {}, not a LlamaBlock", index, (*layers_)[index].type_name());
  return *block;
}

Tensor Llama::logits(const Tensor& idx) {
  Tensor x = (*tok_embeddings_)(idx);  // [B, T, C]
  for (const auto& block : *layers_) x = (*block)(x);
  return (*output_)((*norm_)(x));  // [B, T, V]
}

KVCacheLayout Llama::kv_cache_layout() const {
  return {.num_layers = config_.n_layer,
          .num_kv_heads = config_.n_kv_head,
          .head_dim = config_.head_dim(),
          .dtype = config_.dtype};
}

Tensor Llama::cached_logits(const Tensor& idx, KVCache& cache, const CachedStep& step, bool last_only) {
  Tensor x = (*tok_embeddings_)(idx);  // [B, T, C]
  for (int64_t i = 0; i < config_.n_layer; ++i) x = layer(i).forward_cached(x, cache, i, step);
  if (last_only) x = tessera::narrow(x, 1, x.size(1) - 1, 1);  // [B, 1, C]
  return (*output_)((*norm_)(x));  // [B, T or 1, V]
}

}  // namespace tessera::nn
