// nn::GroupedQueryAttention: projections, RoPE, kv-head sharing, causal attention.
#include "nn/grouped_query_attention.h"

#include "autograd/functions.h"

namespace tessera::nn {

GroupedQueryAttention::GroupedQueryAttention(int64_t embed_dim, int64_t num_heads,
                                             GroupedQueryAttentionOptions options)
    : Module("GroupedQueryAttention"),
      embed_dim_(embed_dim),
      num_heads_(num_heads),
      num_kv_heads_(options.num_kv_heads == 0 ? num_heads : options.num_kv_heads) {
  TESSERA_CHECK(num_heads > 0 && embed_dim > 0 && embed_dim % num_heads == 0,
                "GroupedQueryAttention: embed_dim ({}) must be a positive multiple of num_heads ({})", embed_dim,
                num_heads);
  TESSERA_CHECK(num_kv_heads_ > 0 && num_heads % num_kv_heads_ == 0,
                "GroupedQueryAttention: num_kv_heads ({}) must divide num_heads ({})", num_kv_heads_, num_heads);
  const int64_t D = head_dim();
  const LinearOptions in{.bias = options.bias, .init_std = options.init_std, .device = kMeta, .dtype = options.dtype};
  LinearOptions out = in;
  if (options.out_init_std) out.init_std = options.out_init_std;
  wq_ = register_module("wq", std::make_shared<Linear>(embed_dim, num_heads * D, in));
  wk_ = register_module("wk", std::make_shared<Linear>(embed_dim, num_kv_heads_ * D, in));
  wv_ = register_module("wv", std::make_shared<Linear>(embed_dim, num_kv_heads_ * D, in));
  wo_ = register_module("wo", std::make_shared<Linear>(num_heads * D, embed_dim, out));
  if (options.rope) {
    rope_ = register_module("rope", std::make_shared<RotaryEmbedding>(
                                        D, options.rope->max_seq_len,
                                        RotaryEmbeddingOptions{.theta = options.rope->theta, .device = kMeta,
                                                               .dtype = options.dtype}));
  }
  materialize(options.device);
}

int64_t GroupedQueryAttention::local_heads() const { return wq_->weight().tensor().size(0) / head_dim(); }
int64_t GroupedQueryAttention::local_kv_heads() const { return wk_->weight().tensor().size(0) / head_dim(); }

Tensor GroupedQueryAttention::expand_kv_heads(const Tensor& kv) const {
  const int64_t B = kv.size(0), T = kv.size(1), D = head_dim(), H = local_heads(), Hkv = local_kv_heads();
  const int64_t group = H / Hkv;
  const Tensor heads_first = tessera::transpose(kv, 1, 2);  // [B, Hkv, T, D]
  if (group == 1) return heads_first;
  // [B, Hkv, 1, T, D] -> [B, Hkv, group, T, D] -> [B, H, T, D]
  const Tensor repeated = tessera::expand(tessera::unsqueeze(heads_first, 2), {B, Hkv, group, T, D});
  return tessera::reshape(repeated, {B, H, T, D});
}

GroupedQueryAttention::Heads GroupedQueryAttention::project_heads(const Tensor& x) const {
  TESSERA_CHECK(x.defined() && x.dim() == 3 && x.size(2) == embed_dim_,
                "GroupedQueryAttention: expected input [B, T, {}], got {}", embed_dim_,
                x.defined() ? x.sizes() : Shape{});
  // B and T from the projections: under async tensor parallelism x is a
  // sequence shard and the products gather it (tp/parallel_style.h).
  const Tensor q = (*wq_)(x), k = (*wk_)(x), v = (*wv_)(x);
  const int64_t B = q.size(0), T = q.size(1), D = head_dim();
  return {tessera::view(q, {B, T, local_heads(), D}), tessera::view(k, {B, T, local_kv_heads(), D}),
          tessera::view(v, {B, T, local_kv_heads(), D})};
}

Tensor GroupedQueryAttention::attend_causally(const Heads& heads) const {
  const Tensor y = tessera::scaled_dot_product_attention(tessera::transpose(heads.q, 1, 2), expand_kv_heads(heads.k),
                                                         expand_kv_heads(heads.v));  // [B, H, T, D]
  return tessera::transpose(y, 1, 2);
}

Tensor GroupedQueryAttention::forward(const Tensor& x) {
  Heads heads = project_heads(x);
  if (rope_) {
    heads.q = (*rope_)(heads.q);
    heads.k = (*rope_)(heads.k);
  }
  // [B, T, H, D] -> [B, T, H*D]
  const Shape merged = {heads.q.size(0), heads.q.size(1), local_heads() * head_dim()};
  return (*wo_)(tessera::reshape(attend_causally(heads), merged));
}

Tensor GroupedQueryAttention::forward_cached(const Tensor& x, KVCache& cache, int64_t layer,
                                             const CachedStep& step) {
  check_no_forward_hooks(*this, "GroupedQueryAttention::forward_cached");
  Heads heads = project_heads(x);
  if (rope_) {
    heads.q = rope_->forward_at(heads.q, step.positions);
    heads.k = rope_->forward_at(heads.k, step.positions);
  }
  cache.store(layer, step, heads.k, heads.v);
  // [B, T, H, D] from forward's own ops, or from the cache.
  const Tensor y = step.causal_prefill ? attend_causally(heads) : cache.attend(layer, step, heads.q);
  return (*wo_)(tessera::reshape(y, {x.size(0), x.size(1), embed_dim_}));
}

}  // namespace tessera::nn
