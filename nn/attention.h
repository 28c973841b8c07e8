// nn::CausalSelfAttention: multi-head causal self-attention, GPT-2 style.
// x: [B, T, C] -> qkv Linear [B, T, 3C] -> q, k, v: [B, H, T, D] ->
// causal scaled-dot-product attention -> merge heads [B, T, C] -> proj Linear
// -> dropout. (Dropout applies to the output only, not the attention weights.)
#pragma once

#include <memory>

#include "nn/dropout.h"
#include "nn/gpt_config.h"
#include "nn/linear.h"

namespace tessera::nn {

class CausalSelfAttention : public Module {
 public:
  // Children: qkv (C -> 3C), proj (C -> C, init std 0.02 / sqrt(2 * n_layer)), drop.
  explicit CausalSelfAttention(const GPTConfig& config, Device device = kCPU);

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;

  Linear& qkv() const { return *qkv_; }
  Linear& proj() const { return *proj_; }

 private:
  int64_t n_head_;
  int64_t n_embd_;
  std::shared_ptr<Linear> qkv_;
  std::shared_ptr<Linear> proj_;
  std::shared_ptr<Dropout> drop_;
};

}  // namespace tessera::nn
