// nn::Dropout: inverted dropout in training (each kept element scaled by
// 1/(1-p)), identity in eval. Each training call draws a fresh Philox key from
// the calling thread's default generator, so tessera::manual_seed makes runs
// repeatable and each simulated rank draws its own masks.
#pragma once

#include "nn/module.h"

namespace tessera::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);  // 0 <= p < 1
  Tensor forward(const Tensor& x) override;
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace tessera::nn
