// nn::CausalSelfAttention: qkv projection, head split, causal attention,
// head merge, output projection.
#include "nn/attention.h"

#include "autograd/functions.h"

namespace tessera::nn {

CausalSelfAttention::CausalSelfAttention(int64_t embed_dim, int64_t num_heads, AttentionOptions options)
    : Module("CausalSelfAttention"), embed_dim_(embed_dim), num_heads_(num_heads) {
  TESSERA_CHECK(num_heads > 0 && embed_dim > 0 && embed_dim % num_heads == 0,
                "CausalSelfAttention: embed_dim ({}) must be a positive multiple of num_heads ({})", embed_dim,
                num_heads);
  const LinearOptions qkv{.bias = options.bias, .init_std = options.init_std, .device = kMeta, .dtype = options.dtype};
  LinearOptions proj = qkv;
  if (options.proj_init_std) proj.init_std = options.proj_init_std;
  qkv_ = register_module("qkv", std::make_shared<Linear>(embed_dim, 3 * embed_dim, qkv));
  proj_ = register_module("proj", std::make_shared<Linear>(embed_dim, embed_dim, proj));
  drop_ = register_module("drop", std::make_shared<Dropout>(options.dropout));
  materialize(options.device);
}

int64_t CausalSelfAttention::local_heads() const {
  return qkv_->weight().tensor().size(0) / (3 * (embed_dim_ / num_heads_));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  check_input(x);
  // C is the width of this rank's heads: all of them, or under tensor
  // parallelism the heads whose rows of q, k and v its qkv piece holds.
  // T is qkv's: a product that gathers the sequence (async tensor
  // parallelism) makes it longer than x's.
  const Tensor qkv = (*qkv_)(x);  // [B, T, 3C]
  const int64_t B = qkv.size(0), T = qkv.size(1), H = local_heads(), D = embed_dim_ / num_heads_, C = H * D;
  const std::vector<Tensor> parts = tessera::split(qkv, C, 2);
  // [B, T, C] -> [B, T, H, D] -> [B, H, T, D]
  auto heads = [&](const Tensor& t) { return tessera::transpose(tessera::view(t, {B, T, H, D}), 1, 2); };
  const Tensor y = tessera::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]));
  // [B, H, T, D] -> [B, T, H, D] -> [B, T, C]
  const Tensor merged = tessera::reshape(tessera::transpose(y, 1, 2), {B, T, C});
  return (*drop_)((*proj_)(merged));
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, KVCache& cache, int64_t layer, const CachedStep& step) {
  check_no_forward_hooks(*this, "CausalSelfAttention::forward_cached");
  check_input(x);
  const int64_t B = x.size(0), T = x.size(1), C = embed_dim_, H = num_heads_, D = C / H;
  const std::vector<Tensor> parts = tessera::split((*qkv_)(x), C, 2);  // [B, T, 3C] -> 3 x [B, T, C]
  // [B, T, C] -> [B, T, H, D]
  auto heads = [&](const Tensor& t) { return tessera::view(t, {B, T, H, D}); };
  const Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  cache.store(layer, step, k, v);
  Tensor merged;
  if (step.causal_prefill) {
    // forward's own ops: [B, H, T, D] -> [B, T, H, D] -> [B, T, C]
    const Tensor y = tessera::scaled_dot_product_attention(tessera::transpose(q, 1, 2), tessera::transpose(k, 1, 2),
                                                           tessera::transpose(v, 1, 2));
    merged = tessera::reshape(tessera::transpose(y, 1, 2), {B, T, C});
  } else {
    merged = tessera::reshape(cache.attend(layer, step, q), {B, T, C});
  }
  return (*drop_)((*proj_)(merged));
}

void CausalSelfAttention::check_input(const Tensor& x) const {
  TESSERA_CHECK(x.defined() && x.dim() == 3 && x.size(2) == embed_dim_,
                "CausalSelfAttention: expected input [B, T, {}], got {}", embed_dim_,
                x.defined() ? x.sizes() : Shape{});
}

}  // namespace tessera::nn
