// nn::CausalSelfAttention: qkv projection, head split, causal attention,
// head merge, output projection.
#include "nn/attention.h"

#include <cmath>

#include "autograd/functions.h"
#include "tensor/ops.h"

namespace tessera::nn {

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config, Device device)
    : Module("CausalSelfAttention"), n_head_(config.n_head), n_embd_(config.n_embd) {
  config.validate();
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  qkv_ = register_module("qkv", std::make_shared<Linear>(n_embd_, 3 * n_embd_,
                                                         LinearOptions{.bias = config.bias, .init_std = 0.02,
                                                                       .device = kMeta, .dtype = config.dtype}));
  proj_ = register_module("proj", std::make_shared<Linear>(n_embd_, n_embd_,
                                                           LinearOptions{.bias = config.bias,
                                                                         .init_std = residual_std, .device = kMeta,
                                                                         .dtype = config.dtype}));
  drop_ = register_module("drop", std::make_shared<Dropout>(config.dropout));
  materialize(device);
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  TESSERA_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "CausalSelfAttention: expected input [B, T, {}], got {}",
                n_embd_, x.sizes());
  const int64_t B = x.size(0), T = x.size(1), C = n_embd_, H = n_head_, D = C / H;
  const Tensor qkv = (*qkv_)(x);  // [B, T, 3C]
  const std::vector<Tensor> parts = tessera::split(qkv, C, 2);
  // [B, T, C] -> [B, T, H, D] -> [B, H, T, D]
  auto heads = [&](const Tensor& t) { return tessera::transpose(tessera::view(t, {B, T, H, D}), 1, 2); };
  const Tensor y = tessera::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]));
  // [B, H, T, D] -> [B, T, H, D] -> [B, T, C]
  const Tensor merged = tessera::reshape(tessera::transpose(y, 1, 2), {B, T, C});
  return (*drop_)((*proj_)(merged));
}

}  // namespace tessera::nn
