// nn::GPT: embeddings, the block stack, final norm and the tied head.
#include "nn/gpt.h"

#include "autograd/functions.h"
#include "tensor/ops.h"

namespace tessera::nn {

GPT::GPT(const GPTConfig& config, Device device) : Module("GPT"), config_(config) {
  config_.validate();
  const EmbeddingOptions embedding{.init_std = 0.02, .device = kMeta, .dtype = config_.dtype};
  wte_ = register_module("wte", std::make_shared<Embedding>(config_.vocab_size, config_.n_embd, embedding));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(config_.block_size, config_.n_embd, embedding));
  drop_ = register_module("drop", std::make_shared<Dropout>(config_.dropout));
  blocks_ = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config_.n_layer; ++i) blocks_->push_back(std::make_shared<TransformerBlock>(config_, kMeta));
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

Tensor GPT::forward(const Tensor& idx) { return forward_inputs({idx}); }

Tensor GPT::forward_inputs(const TensorList& inputs) {
  TESSERA_CHECK(inputs.size() == 1 || inputs.size() == 2, "GPT: takes {{idx}} or {{idx, targets}}, got {} inputs",
                inputs.size());
  const Tensor& idx = inputs[0];
  TESSERA_CHECK(idx.defined() && idx.dim() == 2 && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32),
                "GPT: idx must be [B, T] i32/i64, got {} {}", idx.defined() ? idx.sizes() : Shape{},
                idx.defined() ? dtype_name(idx.dtype()) : "undefined");
  const int64_t B = idx.size(0), T = idx.size(1);
  TESSERA_CHECK(T >= 1 && T <= config_.block_size, "GPT: sequence length {} is outside [1, block_size {}]", T,
                config_.block_size);

  const Tensor positions = ops::arange(0, static_cast<double>(T), 1, {.dtype = DType::i64, .device = idx.device()});
  // [B, T, C] + [T, C]
  Tensor x = tessera::add((*wte_)(idx), (*wpe_)(positions));
  x = (*drop_)(x);
  for (const auto& block : *blocks_) x = (*block)(x);
  x = (*ln_f_)(x);
  // Tied head: [B, T, C] x [V, C]^T -> [B, T, V] through wte's weight.
  const Tensor logits = (*lm_head_)(x);
  if (inputs.size() == 1) return logits;

  const Tensor& targets = inputs[1];
  TESSERA_CHECK(targets.defined() && targets.sizes() == idx.sizes(), "GPT: targets must be [{}, {}] like idx, got {}",
                B, T, targets.defined() ? targets.sizes() : Shape{});
  return tessera::cross_entropy(tessera::view(logits, {B * T, config_.vocab_size}), tessera::reshape(targets, {B * T}));
}

}  // namespace tessera::nn
