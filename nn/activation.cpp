// Activation modules over the differentiable functions.
#include "nn/activation.h"

namespace tessera::nn {

GELU::GELU(GeluApproximation approximation) : Module("GELU"), approximation_(approximation) {}

Tensor GELU::forward(const Tensor& x) { return tessera::gelu(x, approximation_); }

SiLU::SiLU() : Module("SiLU") {}

Tensor SiLU::forward(const Tensor& x) { return tessera::silu(x); }

ReLU::ReLU() : Module("ReLU") {}

Tensor ReLU::forward(const Tensor& x) { return tessera::relu(x); }

Tanh::Tanh() : Module("Tanh") {}

Tensor Tanh::forward(const Tensor& x) { return tessera::tanh(x); }

}  // namespace tessera::nn
