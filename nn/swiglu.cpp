// nn::SwiGLU: gate, up and down projections.
#include "nn/swiglu.h"

#include "autograd/functions.h"

namespace tessera::nn {

SwiGLU::SwiGLU(int64_t dim, int64_t hidden_dim, SwiGLUOptions options) : Module("SwiGLU") {
  const LinearOptions in{.bias = options.bias, .init_std = options.init_std, .device = kMeta, .dtype = options.dtype};
  LinearOptions out = in;
  if (options.out_init_std) out.init_std = options.out_init_std;
  w1_ = register_module("w1", std::make_shared<Linear>(dim, hidden_dim, in));
  w2_ = register_module("w2", std::make_shared<Linear>(hidden_dim, dim, out));
  w3_ = register_module("w3", std::make_shared<Linear>(dim, hidden_dim, in));
  materialize(options.device);
}

Tensor SwiGLU::forward(const Tensor& x) {
  return (*w2_)(tessera::mul(tessera::silu((*w1_)(x)), (*w3_)(x)));  // [..., F] gated -> [..., C]
}

}  // namespace tessera::nn
