// optim::AdamW: Adam with decoupled weight decay (Loshchilov & Hutter), as
// torch.optim.AdamW. Per element, at step t:
//   p *= 1 - lr * wd
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// One fused pass over each parameter's contiguous data (f32 or f64), split
// across threads: no temporaries on the hot path of a training step.
#pragma once

#include "nn/optim/optimizer.h"

namespace tessera::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  AdamW(const std::vector<nn::NamedParameter>& params, AdamWOptions options = {});

  const AdamWOptions& options() const { return options_; }

 protected:
  void init_param_state(const Tensor& param, ParamState& state) const override;
  void update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) override;

 private:
  AdamWOptions options_;
};

}  // namespace tessera::optim
