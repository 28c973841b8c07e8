// nn::MLP: fc -> GELU(tanh) -> proj -> dropout.
#include "nn/mlp.h"

#include <cmath>

namespace tessera::nn {

MLP::MLP(const GPTConfig& config, Device device) : Module("MLP") {
  config.validate();
  const int64_t C = config.n_embd;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  fc_ = register_module("fc", std::make_shared<Linear>(C, 4 * C, LinearOptions{.bias = config.bias, .init_std = 0.02,
                                                                               .device = kMeta, .dtype = config.dtype}));
  gelu_ = register_module("gelu", std::make_shared<GELU>(GeluApproximation::tanh));
  proj_ = register_module("proj", std::make_shared<Linear>(4 * C, C, LinearOptions{.bias = config.bias,
                                                                                   .init_std = residual_std,
                                                                                   .device = kMeta, .dtype = config.dtype}));
  drop_ = register_module("drop", std::make_shared<Dropout>(config.dropout));
  materialize(device);
}

Tensor MLP::forward(const Tensor& x) { return (*drop_)((*proj_)((*gelu_)((*fc_)(x)))); }

}  // namespace tessera::nn
