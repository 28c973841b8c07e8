// nn::TiedLinear: a bias-free linear map through a borrowed weight.
#include "nn/tied_linear.h"

#include "autograd/functions.h"

namespace tessera::nn {

TiedLinear::TiedLinear(std::shared_ptr<Parameter> weight) : Module("TiedLinear") {
  TESSERA_CHECK(weight != nullptr && weight->global_shape().size() == 2,
                "TiedLinear: the weight must be a 2-D parameter, got {}",
                weight ? weight->global_shape() : Shape{});
  register_parameter("weight", std::move(weight));
}

Tensor TiedLinear::forward(const Tensor& input) { return tessera::linear(input, weight().tensor(), Tensor()); }

}  // namespace tessera::nn
