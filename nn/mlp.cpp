// nn::MLP: fc -> activation -> proj -> dropout, the first three fused for GELU(tanh).
#include "nn/mlp.h"

#include <typeinfo>

#include "nn/activation.h"

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

// Exactly nn::GELU (a subclass may override forward), and nothing hooked on
// the children that the fused call would skip.
bool MLP::fuses_gelu() const {
  const Module& activation = *activation_;
  if (typeid(activation) != typeid(GELU)) return false;
  if (static_cast<const GELU&>(activation).approximation() != GeluApproximation::tanh) return false;
  return !fc_->has_forward_hooks() && !activation_->has_forward_hooks() && !proj_->has_forward_hooks() &&
         !proj_->defers_bias() && fc_->is_plain() && proj_->is_plain();
}

Tensor MLP::forward(const Tensor& x) {
  if (!fuses_gelu()) return (*drop_)((*proj_)((*activation_)((*fc_)(x))));
  TESSERA_CHECK(x.dim() >= 1 && x.size(-1) == fc_->in_features(), "MLP: expected input [..., {}], got {}",
                fc_->in_features(), x.sizes());
  const auto bias = [](const Linear& linear) { return linear.has_bias() ? linear.bias().tensor() : Tensor(); };
  return (*drop_)(
      linear_gelu_linear(x, fc_->weight().tensor(), bias(*fc_), proj_->weight().tensor(), bias(*proj_)));
}

}  // namespace tessera::nn
