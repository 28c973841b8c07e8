// optim::SGD: stochastic gradient descent with optional momentum (dampening 0,
// optional Nesterov) and L2 weight decay added to the gradient, as torch.optim.SGD:
//   g = grad + wd * p;  buf = momentum * buf + g (buf = g on the first step)
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
#pragma once

#include "nn/optim/optimizer.h"

namespace tessera::optim {

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  bool nesterov = false;  // needs momentum > 0
  double weight_decay = 0.0;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions options = {});
  SGD(const std::vector<nn::NamedParameter>& params, SGDOptions options = {});

  const SGDOptions& options() const { return options_; }

 protected:
  void init_param_state(const Tensor& param, ParamState& state) const override;
  void update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) override;

 private:
  SGDOptions options_;
};

}  // namespace tessera::optim
