// nn::MLP: GPT-2's feed-forward block: fc (C -> 4C), GELU (tanh), proj (4C -> C), dropout.
#pragma once

#include <memory>

#include "nn/activation.h"
#include "nn/dropout.h"
#include "nn/gpt_config.h"
#include "nn/linear.h"

namespace tessera::nn {

class MLP : public Module {
 public:
  // proj's weights use the residual init std 0.02 / sqrt(2 * n_layer).
  explicit MLP(const GPTConfig& config, Device device = kCPU);

  // x: [..., C] -> [..., C]
  Tensor forward(const Tensor& x) override;

  Linear& fc() const { return *fc_; }
  Linear& proj() const { return *proj_; }

 private:
  std::shared_ptr<Linear> fc_;
  std::shared_ptr<GELU> gelu_;
  std::shared_ptr<Linear> proj_;
  std::shared_ptr<Dropout> drop_;
};

}  // namespace tessera::nn
