// nn::TransformerBlock: one pre-norm GPT-2 block,
//   x = x + attn(ln1(x));  x = x + mlp(ln2(x))
// with LayerNorm, CausalSelfAttention and a GELU(tanh) MLP. FSDP shards a
// model one block at a time, so this is its usual unit. With no forward hooks
// on ln2, the first residual add and ln2 run as one tessera::add_layer_norm:
// the same values and gradients, one pass over the rows fewer each way. (Llama's block, with
// RMSNorm, rotary GQA and SwiGLU, is nn::LlamaBlock in nn/models/llama.h.)
#pragma once

#include <memory>
#include <optional>

#include "nn/attention.h"
#include "nn/mlp.h"
#include "nn/normalization.h"

namespace tessera::nn {

struct TransformerBlockOptions {
  int64_t mlp_hidden = 0;  // 0: 4 * embed_dim
  bool bias = true;        // in the Linears and LayerNorms
  double dropout = 0.0;    // on the attention and MLP outputs
  double norm_eps = 1e-5;
  // Unset: Linear's default init; set: N(0, std), zero bias.
  std::optional<double> init_std = std::nullopt;
  // attn.proj's and mlp.proj's std (into the residual stream); unset: init_std.
  std::optional<double> residual_init_std = std::nullopt;
  Device device = kCPU;
  DType dtype = DType::f32;
};

class TransformerBlock : public Module {
 public:
  // Children: ln1, attn, ln2, mlp.
  TransformerBlock(int64_t embed_dim, int64_t num_heads, TransformerBlockOptions options = {});

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;
  // The same for a KVCache step's new tokens, attention over layer `layer`
  // of the cache (nn/kv_cache.h).
  Tensor forward_cached(const Tensor& x, KVCache& cache, int64_t layer, const CachedStep& step);

  LayerNorm& ln1() const { return *ln1_; }
  CausalSelfAttention& attn() const { return *attn_; }
  LayerNorm& ln2() const { return *ln2_; }
  MLP& mlp() const { return *mlp_; }

 private:
  // Whether forward may run h = x + attn(...) and ln2(h) as add_layer_norm.
  bool fuses_residual_norm() const;
  // x + attended, then the MLP's residual: the block after its attention.
  Tensor residual_and_mlp(const Tensor& x, const Tensor& attended);

  std::shared_ptr<LayerNorm> ln1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<LayerNorm> ln2_;
  std::shared_ptr<MLP> mlp_;
};

}  // namespace tessera::nn
