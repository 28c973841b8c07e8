// LoRA and QLoRA fine-tuning of a CausalLM (train --lora R [--nf4]), as
// torchtune's recipes do it: adapters on every attention and MLP projection
// (the Linears inside the blocks), every other parameter frozen (embeddings,
// norms, the head), and with NF4 the frozen projections stored in 4 bits
// (nn/linear.h, tensor/nf4_format.h).
//
// The model's checkpoints keep what training holds: the packed NF4 rows and
// the adapters, so that a resume continues bit for bit. Outside them the
// model is a dense one:
// - pretrained weights load through dense stand-ins of the packed weights,
//   each rank quantising its own rows (no rank ever holds a whole layer);
// - exports (safetensors and Hugging Face) hold the merged weights,
//   W = dequantised base + (alpha / R) B A, under the base's names, and no
//   adapter: any loader of the dense model reads them.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"
#include "nn/linear.h"
#include "nn/models/causal_lm.h"
#include "train/train_config.h"

namespace tessera::train {

struct NamedLinear {
  std::string name;  // "layers.0.attention.wq"
  nn::Linear* linear;
};

// The projections adapters go on: every nn::Linear inside the blocks, in
// the model's order.
std::vector<NamedLinear> block_linears(nn::CausalLM& model);

// Freezes every parameter, quantises the projections into NF4 when
// config.nf4, and adds the adapters (seeded by config.seed and their names,
// so every world size draws the same ones). On the model as built, before
// tensor parallelism and fully_shard; nothing when config.lora_rank is 0.
void prepare_fine_tuning(nn::CausalLM& model, const TrainConfig& config);

// What a loader of pretrained (dense) weights fills: model_state(model, "")
// without the adapters, with each NF4 weight's entry a dense stand-in laid
// out like its rows (this rank's FSDP shard). quantize_loaded() packs the
// stand-ins into the weights once the loader is done.
class PretrainedWeightsTarget {
 public:
  explicit PretrainedWeightsTarget(nn::CausalLM& model);
  const checkpoint::DistributedStateDict& state() const { return state_; }
  void quantize_loaded();

 private:
  struct DenseStandIn {
    nn::Linear* linear;
    Tensor rows;
  };
  checkpoint::DistributedStateDict state_;
  std::vector<DenseStandIn> stand_ins_;
};

// model_state(model, "") of the dense model the fine-tuned one computes:
// each adapted projection's weight merged (NF4 dequantised, the adapter's
// product added) under its own name, laid out like its rows; no adapter
// entries. Collective under FSDP (each adapter's A is gathered whole).
checkpoint::DistributedStateDict merged_model_state(nn::CausalLM& model);

}  // namespace tessera::train
