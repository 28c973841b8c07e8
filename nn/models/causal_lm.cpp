// nn::CausalLM: input checks and the loss, shared by the decoder models.
#include "nn/models/causal_lm.h"

#include "autograd/functions.h"
#include "autograd/grad_mode.h"

namespace tessera::nn {

CausalLM::CausalLM(std::string type_name) : Module(std::move(type_name)) {}

Tensor CausalLM::forward(const Tensor& idx) { return forward_inputs({idx}); }

Tensor CausalLM::forward_inputs(const TensorList& inputs) {
  TESSERA_CHECK(inputs.size() == 1 || inputs.size() == 2, "{}: takes {{idx}} or {{idx, targets}}, got {} inputs",
                type_name(), inputs.size());
  const Tensor& idx = inputs[0];
  TESSERA_CHECK(idx.defined() && idx.dim() == 2 && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32),
                "{}: idx must be [B, T] i32/i64, got {} {}", type_name(), idx.defined() ? idx.sizes() : Shape{},
                idx.defined() ? dtype_name(idx.dtype()) : "undefined");
  const int64_t B = idx.size(0), T = idx.size(1);
  TESSERA_CHECK(T >= 1 && T <= block_size(), "{}: sequence length {} is outside [1, block_size {}]", type_name(), T,
                block_size());
  const int64_t V = vocab_size(), padded = padded_vocab_size();
  Tensor scores = logits(idx);  // [B, T, Vp], or this rank's columns of it
  if (inputs.size() == 1) {
    if (sharded_logits_) scores = sharded_logits_->gather(scores);
    return padded == V ? scores : tessera::narrow(scores, 2, 0, V);
  }
  const Tensor& targets = inputs[1];
  TESSERA_CHECK(targets.defined() && targets.sizes() == idx.sizes(), "{}: targets must be [{}, {}] like idx, got {}",
                type_name(), B, T, targets.defined() ? targets.sizes() : Shape{});
  if (sharded_logits_) {
    return sharded_logits_->loss(tessera::view(scores, {B * T, scores.size(2)}), tessera::reshape(targets, {B * T}));
  }
  // The padded columns go into the loss as padding, not through a narrow: its
  // backward would write a second [B*T, Vp] gradient.
  return tessera::cross_entropy(tessera::view(scores, {B * T, padded}), tessera::reshape(targets, {B * T}), -100, V);
}

KVCache CausalLM::make_kv_cache(int64_t batch, int64_t capacity, std::vector<int64_t> padding) const {
  const std::vector<std::shared_ptr<Parameter>> params = parameters();
  TESSERA_CHECK(!params.empty(), "{}: make_kv_cache needs the model's parameters (none)", type_name());
  return KVCache(kv_cache_layout(), batch, capacity, params.front()->tensor().device(), std::move(padding));
}

Tensor CausalLM::forward_cached(const Tensor& idx, KVCache& cache, CachedLogits which) {
  check_no_forward_hooks(*this, fmt::format("{}::forward_cached", type_name()));
  // Every decoding step checks; names are built only for the message.
  for (const auto& parameter : parameters()) {
    if (parameter->tensor_parallel() == nullptr) continue;
    std::string name;
    for (const auto& [fqn, named] : named_parameters()) {
      if (named == parameter) name = fqn;
    }
    fail("{}::forward_cached: {} is a tensor-parallel piece ({}); decoding with a KV cache runs on a whole model "
         "(gather the state dict with tp::full_state_dict and load it into an unsharded one)",
         type_name(), name, parameter->tensor_parallel()->to_string());
  }
  TESSERA_CHECK(idx.defined() && idx.dim() == 2 && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32),
                "{}::forward_cached: idx must be [B, T] i32/i64, got {} {}", type_name(),
                idx.defined() ? idx.sizes() : Shape{}, idx.defined() ? dtype_name(idx.dtype()) : "undefined");
  TESSERA_CHECK(cache.layout() == kv_cache_layout(),
                "{}::forward_cached: the cache holds {} layers of {} kv heads x {} ({}), the model needs {} of {} x {} "
                "({}): a cache of another model",
                type_name(), cache.layout().num_layers, cache.layout().num_kv_heads, cache.layout().head_dim,
                dtype_name(cache.layout().dtype), kv_cache_layout().num_layers, kv_cache_layout().num_kv_heads,
                kv_cache_layout().head_dim, dtype_name(kv_cache_layout().dtype));
  TESSERA_CHECK(idx.size(0) == cache.batch(), "{}::forward_cached: idx has {} sequences, the cache {}", type_name(),
                idx.size(0), cache.batch());
  TESSERA_CHECK(idx.device() == cache.device(), "{}::forward_cached: idx is on {}, the cache on {}", type_name(),
                idx.device().str(), cache.device().str());
  autograd::NoGradGuard no_grad;
  const CachedStep step = cache.begin_step(idx.size(1), block_size());
  const Tensor scores = cached_logits(idx, cache, step, which == CachedLogits::last);  // [B, T or 1, Vp]
  cache.advance(step);
  const int64_t V = vocab_size();
  return padded_vocab_size() == V ? scores : tessera::narrow(scores, 2, 0, V);
}

}  // namespace tessera::nn
