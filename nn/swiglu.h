// nn::SwiGLU: the gated feed-forward network of Llama and PaLM (Shazeer 2020),
//   x: [..., C] -> w2( silu(w1(x)) * w3(x) ): [..., C], hidden width F.
// Three matrices instead of MLP's two, so at equal parameters F is about
// 2/3 of MLP's 4C (Llama 2 7B: C 4096, F 11008).
#pragma once

#include <memory>
#include <optional>

#include "nn/linear.h"

namespace tessera::nn {

struct SwiGLUOptions {
  bool bias = false;
  // Unset: Linear's default init; set: N(0, std), zero bias.
  std::optional<double> init_std = std::nullopt;
  std::optional<double> out_init_std = std::nullopt;  // w2's std; unset: init_std
  Device device = kCPU;
  DType dtype = DType::f32;
};

class SwiGLU : public Module {
 public:
  // Children: w1 (C -> F, gate), w2 (F -> C, out), w3 (C -> F, up).
  SwiGLU(int64_t dim, int64_t hidden_dim, SwiGLUOptions options = {});

  // x: [..., C] -> [..., C]
  Tensor forward(const Tensor& x) override;

  Linear& w1() const { return *w1_; }
  Linear& w2() const { return *w2_; }
  Linear& w3() const { return *w3_; }

 private:
  std::shared_ptr<Linear> w1_;
  std::shared_ptr<Linear> w2_;
  std::shared_ptr<Linear> w3_;
};

}  // namespace tessera::nn
