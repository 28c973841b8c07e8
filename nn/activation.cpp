// GELU and SiLU modules over the differentiable functions.
#include "nn/activation.h"

namespace tessera::nn {

GELU::GELU(GeluApproximation approximation) : Module("GELU"), approximation_(approximation) {}

Tensor GELU::forward(const Tensor& x) { return tessera::gelu(x, approximation_); }

SiLU::SiLU() : Module("SiLU") {}

Tensor SiLU::forward(const Tensor& x) { return tessera::silu(x); }

}  // namespace tessera::nn
