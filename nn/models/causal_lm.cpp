// nn::CausalLM: input checks and the loss, shared by the decoder models.
#include "nn/models/causal_lm.h"

#include "autograd/functions.h"

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
  const Tensor scores = logits(idx);  // [B, T, Vp]
  if (inputs.size() == 1) return padded == V ? scores : tessera::narrow(scores, 2, 0, V);
  const Tensor& targets = inputs[1];
  TESSERA_CHECK(targets.defined() && targets.sizes() == idx.sizes(), "{}: targets must be [{}, {}] like idx, got {}",
                type_name(), B, T, targets.defined() ? targets.sizes() : Shape{});
  // The padded columns go into the loss as padding, not through a narrow: its
  // backward would write a second [B*T, Vp] gradient.
  return tessera::cross_entropy(tessera::view(scores, {B * T, padded}), tessera::reshape(targets, {B * T}), -100, V);
}

}  // namespace tessera::nn
