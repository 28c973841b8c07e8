// nn::TransformerBlock: one pre-norm GPT-2 block,
//   x = x + attn(ln1(x));  x = x + mlp(ln2(x)).
// FSDP shards a model one block at a time, so this is its usual unit.
#pragma once

#include <memory>

#include "nn/attention.h"
#include "nn/mlp.h"
#include "nn/normalization.h"

namespace tessera::nn {

class TransformerBlock : public Module {
 public:
  // Children: ln1, attn, ln2, mlp.
  explicit TransformerBlock(const GPTConfig& config, Device device = kCPU);

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;

  LayerNorm& ln1() const { return *ln1_; }
  CausalSelfAttention& attn() const { return *attn_; }
  LayerNorm& ln2() const { return *ln2_; }
  MLP& mlp() const { return *mlp_; }

 private:
  std::shared_ptr<LayerNorm> ln1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<LayerNorm> ln2_;
  std::shared_ptr<MLP> mlp_;
};

}  // namespace tessera::nn
