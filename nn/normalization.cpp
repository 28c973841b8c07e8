// nn::LayerNorm and nn::RMSNorm: unit scale, zero shift at init.
#include "nn/normalization.h"

#include "autograd/functions.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace tessera::nn {

LayerNorm::LayerNorm(int64_t dim, LayerNormOptions options)
    : Module("LayerNorm"), dim_(dim), eps_(options.eps), has_bias_(options.bias) {
  TESSERA_CHECK(dim > 0, "LayerNorm: dim must be positive, got {}", dim);
  TESSERA_CHECK(options.eps > 0.0, "LayerNorm: eps must be positive, got {}", options.eps);
  const TensorOptions meta{.dtype = options.dtype, .device = kMeta};
  register_parameter("weight", ops::empty({dim}, meta));
  if (has_bias_) register_parameter("bias", ops::empty({dim}, meta));
  materialize(options.device);
}

Tensor LayerNorm::forward(const Tensor& x) {
  TESSERA_CHECK(x.dim() >= 1 && x.size(-1) == dim_, "LayerNorm: expected input [..., {}], got {}", dim_, x.sizes());
  return tessera::layer_norm(x, weight().tensor(), has_bias_ ? bias().tensor() : Tensor(), eps_);
}

void LayerNorm::reset_own_parameters(const InitContext&) {
  init::ones_(weight());
  if (has_bias_) init::zeros_(bias());
}

RMSNorm::RMSNorm(int64_t dim, RMSNormOptions options) : Module("RMSNorm"), dim_(dim), eps_(options.eps) {
  TESSERA_CHECK(dim > 0, "RMSNorm: dim must be positive, got {}", dim);
  TESSERA_CHECK(options.eps > 0.0, "RMSNorm: eps must be positive, got {}", options.eps);
  register_parameter("weight", ops::empty({dim}, {.dtype = options.dtype, .device = kMeta}));
  materialize(options.device);
}

Tensor RMSNorm::forward(const Tensor& x) {
  TESSERA_CHECK(x.dim() >= 1 && x.size(-1) == dim_, "RMSNorm: expected input [..., {}], got {}", dim_, x.sizes());
  return tessera::rms_norm(x, weight().tensor(), eps_);
}

void RMSNorm::reset_own_parameters(const InitContext&) { init::ones_(weight()); }

}  // namespace tessera::nn
