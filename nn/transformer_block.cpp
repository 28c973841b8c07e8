// nn::TransformerBlock: pre-norm residual attention and MLP.
#include "nn/transformer_block.h"

#include "autograd/functions.h"

namespace tessera::nn {

TransformerBlock::TransformerBlock(const GPTConfig& config, Device device) : Module("TransformerBlock") {
  config.validate();
  const LayerNormOptions norm{.eps = config.norm_eps, .bias = config.bias, .device = kMeta, .dtype = config.dtype};
  ln1_ = register_module("ln1", std::make_shared<LayerNorm>(config.n_embd, norm));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(config, kMeta));
  ln2_ = register_module("ln2", std::make_shared<LayerNorm>(config.n_embd, norm));
  mlp_ = register_module("mlp", std::make_shared<MLP>(config, kMeta));
  materialize(device);
}

Tensor TransformerBlock::forward(const Tensor& x) {
  const Tensor h = tessera::add(x, (*attn_)((*ln1_)(x)));  // [B, T, C]
  return tessera::add(h, (*mlp_)((*ln2_)(h)));
}

}  // namespace tessera::nn
