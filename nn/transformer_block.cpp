// nn::TransformerBlock: pre-norm residual attention and MLP.
#include "nn/transformer_block.h"

#include "autograd/functions.h"
#include "nn/activation.h"

namespace tessera::nn {

TransformerBlock::TransformerBlock(int64_t embed_dim, int64_t num_heads, TransformerBlockOptions options)
    : Module("TransformerBlock") {
  TESSERA_CHECK(options.mlp_hidden >= 0, "TransformerBlock: mlp_hidden must be positive (or 0 for 4C), got {}",
                options.mlp_hidden);
  const int64_t hidden = options.mlp_hidden == 0 ? 4 * embed_dim : options.mlp_hidden;
  const LayerNormOptions norm{.eps = options.norm_eps, .bias = options.bias, .device = kMeta, .dtype = options.dtype};
  ln1_ = register_module("ln1", std::make_shared<LayerNorm>(embed_dim, norm));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(
                                      embed_dim, num_heads,
                                      AttentionOptions{.bias = options.bias, .init_std = options.init_std,
                                                       .proj_init_std = options.residual_init_std,
                                                       .dropout = options.dropout, .device = kMeta,
                                                       .dtype = options.dtype}));
  ln2_ = register_module("ln2", std::make_shared<LayerNorm>(embed_dim, norm));
  mlp_ = register_module("mlp", std::make_shared<MLP>(embed_dim, hidden, embed_dim,
                                                      std::make_shared<GELU>(GeluApproximation::tanh),
                                                      MLPOptions{.bias = options.bias, .init_std = options.init_std,
                                                                 .proj_init_std = options.residual_init_std,
                                                                 .dropout = options.dropout, .device = kMeta,
                                                                 .dtype = options.dtype}));
  materialize(options.device);
}

// The residual add h = x + attn(...) and ln2(h) run as one add_layer_norm
// (one pass over the rows each way, forward and backward, where the add
// and the norm take two; the same bits) unless ln2 has forward hooks, which
// only a call of ln2 runs: FSDP's, were ln2 sharded on its own, or a user's.
bool TransformerBlock::fuses_residual_norm() const { return !ln2_->has_forward_hooks(); }

Tensor TransformerBlock::forward(const Tensor& x) { return residual_and_mlp(x, (*attn_)((*ln1_)(x))); }

Tensor TransformerBlock::forward_cached(const Tensor& x, KVCache& cache, int64_t layer, const CachedStep& step) {
  check_no_forward_hooks(*this, "TransformerBlock::forward_cached");
  return residual_and_mlp(x, attn_->forward_cached((*ln1_)(x), cache, layer, step));
}

Tensor TransformerBlock::residual_and_mlp(const Tensor& x, const Tensor& attended) {  // [B, T, C] each
  if (!fuses_residual_norm()) {
    const Tensor h = tessera::add(x, attended);
    return tessera::add(h, (*mlp_)((*ln2_)(h)));
  }
  const Tensor bias = ln2_->has_bias() ? ln2_->bias().tensor() : Tensor();
  const AddLayerNormOutput h = tessera::add_layer_norm(x, attended, ln2_->weight().tensor(), bias, ln2_->eps());
  return tessera::add(h.sum, (*mlp_)(h.normalized));
}

}  // namespace tessera::nn
