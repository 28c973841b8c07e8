// nn::CausalLM: what GPT and Llama share as decoder-only language models, so
// that trainers, FSDP wrapping and generation are written once:
//   {idx} -> logits [B, T, V];  {idx, targets} -> mean cross-entropy (0-d),
//   idx and targets: [B, T] i32/i64 with 1 <= T <= block_size;
//   a padded vocabulary (Vp > V rows in the embedding and head, for aligned
//   GEMMs) stays inside: the loss takes the padded logits with V classes,
//   and {idx} returns the V real columns (a view);
//   blocks(): the repeated layers, fully_shard's usual units.
#pragma once

#include <string>

#include "nn/module_list.h"

namespace tessera::nn {

class CausalLM : public Module {
 public:
  Tensor forward_inputs(const TensorList& inputs) final;
  Tensor forward(const Tensor& idx) final;  // logits
  // (*this)({idx, targets}): runs the hooks like any call.
  Tensor loss(const Tensor& idx, const Tensor& targets) { return (*this)(TensorList{idx, targets}); }

  virtual ModuleList& blocks() const = 0;
  virtual int64_t vocab_size() const = 0;
  // The head's output columns: vocab_size() plus padding (none by default).
  virtual int64_t padded_vocab_size() const { return vocab_size(); }
  virtual int64_t block_size() const = 0;

 protected:
  explicit CausalLM(std::string type_name);
  // idx: [B, T], already checked -> logits [B, T, padded_vocab_size()].
  virtual Tensor logits(const Tensor& idx) = 0;
};

}  // namespace tessera::nn
