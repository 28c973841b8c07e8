// Activation modules without parameters: ReLU, Tanh, GELU (exact erf form or
// the tanh approximation GPT-2 uses) and SiLU (x * sigmoid(x)).
#pragma once

#include "autograd/functions.h"
#include "nn/module.h"

namespace tessera::nn {

class GELU : public Module {
 public:
  // none = exact: x * Phi(x); tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  explicit GELU(GeluApproximation approximation = GeluApproximation::none);
  Tensor forward(const Tensor& x) override;
  GeluApproximation approximation() const { return approximation_; }

 private:
  GeluApproximation approximation_;
};

class SiLU : public Module {
 public:
  SiLU();
  Tensor forward(const Tensor& x) override;
};

class ReLU : public Module {
 public:
  ReLU();
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tanh();
  Tensor forward(const Tensor& x) override;
};

}  // namespace tessera::nn
