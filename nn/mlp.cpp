// nn::MLP: fc -> activation -> proj -> dropout.
#include "nn/mlp.h"

namespace tessera::nn {

MLP::MLP(int64_t in_features, int64_t hidden_features, int64_t out_features, std::shared_ptr<Module> activation,
         MLPOptions options)
    : Module("MLP") {
  TESSERA_CHECK(activation != nullptr, "MLP: the activation module is null (pass e.g. std::make_shared<nn::ReLU>())");
  const LinearOptions fc{.bias = options.bias, .init_std = options.init_std, .device = kMeta, .dtype = options.dtype};
  LinearOptions proj = fc;
  if (options.proj_init_std) proj.init_std = options.proj_init_std;
  fc_ = register_module("fc", std::make_shared<Linear>(in_features, hidden_features, fc));
  activation_ = register_module("act", std::move(activation));
  proj_ = register_module("proj", std::make_shared<Linear>(hidden_features, out_features, proj));
  drop_ = register_module("drop", std::make_shared<Dropout>(options.dropout));
  materialize(options.device);
}

Tensor MLP::forward(const Tensor& x) { return (*drop_)((*proj_)((*activation_)((*fc_)(x)))); }

}  // namespace tessera::nn
