// nn::Dropout: a fresh Philox key per training call; identity in eval.
#include "nn/dropout.h"

#include "autograd/functions.h"

namespace tessera::nn {

Dropout::Dropout(double p) : Module("Dropout"), p_(p) {
  TESSERA_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0) return x;
  return tessera::dropout(x, p_, true, default_generator().next_key());
}

}  // namespace tessera::nn
