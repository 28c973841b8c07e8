// nn::Linear: parameters, init (torch default or GPT-2 normal) and forward.
#include "nn/linear.h"

#include <cmath>

#include "autograd/functions.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace tessera::nn {

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : Module("Linear"),
      in_features_(in_features),
      out_features_(out_features),
      has_bias_(options.bias),
      init_std_(options.init_std) {
  TESSERA_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in {} out {}",
                in_features, out_features);
  const TensorOptions meta{.dtype = options.dtype, .device = kMeta};
  register_parameter("weight", ops::empty({out_features, in_features}, meta));
  if (has_bias_) register_parameter("bias", ops::empty({out_features}, meta));
  materialize(options.device);
}

Tensor Linear::forward(const Tensor& x) {
  const Tensor& w = weight().tensor();
  TESSERA_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "Linear: expected input [..., {}], got {}", w.size(1),
                x.sizes());
  const Tensor b = has_bias_ && !defers_bias_ ? bias().tensor() : Tensor();
  return product_ ? product_(x, w, b) : tessera::linear(x, w, b);
}

void Linear::reset_own_parameters(const InitContext& context) {
  if (init_std_) {
    init::normal_(weight(), context.key("weight"), 0.0, *init_std_);
    if (has_bias_) init::zeros_(bias());
    return;
  }
  // torch's default: kaiming_uniform(a = sqrt(5)) = U(+-1/sqrt(in)) for both.
  init::kaiming_uniform_(weight(), context.key("weight"), std::sqrt(5.0));
  if (has_bias_) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
    init::uniform_(bias(), context.key("bias"), -bound, bound);
  }
}

}  // namespace tessera::nn
