// The trainer's settings as JSON, the form checkpoints carry: the model
// shape (every field of its family's config: what `generate` needs to
// rebuild the model before loading its weights) and, for the record, the
// training run's settings. The training side stores them in a checkpoint's
// training_state as {"config": {"model": ..., "train": ...}} and in an
// exported .safetensors file's __metadata__ under kGptConfigMetadataKey (the
// model JSON as text, next to the step under kStepMetadataKey).
// A model's family is its JSON's "family" field; a GPT's JSON has none (as
// before there were families), so every GPT checkpoint, export and run
// identity reads and compares as it always did.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "nn/models/gpt_config.h"
#include "nn/models/llama_config.h"
#include "train/model_family.h"
#include "train/train_config.h"

namespace tessera::train {

// The model config of any family (the name is older than the families).
inline constexpr const char* kGptConfigMetadataKey = "tessera.gpt_config";
inline constexpr const char* kStepMetadataKey = "tessera.step";  // the training step, as decimal text

// {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 64,
//  "dropout": 0.0, "bias": true, "norm_eps": 1e-05}
nlohmann::json model_config_to_json(const tessera::nn::GPTConfig& config);
// {"family": "llama", "vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 4,
//  "n_kv_head": 2, "n_embd": 64, "ffn_hidden": 192, "rope_theta": 10000.0, "norm_eps": 1e-05}
nlohmann::json model_config_to_json(const tessera::nn::LlamaConfig& config);
nlohmann::json model_config_to_json(const ModelConfig& config);

// The family a model JSON records: its "family" string, gpt when absent.
// Throws tessera::Error naming `source` for a family that is not a string
// or not known.
ModelFamily model_family_from_json(const nlohmann::json& json, const std::string& source);

// The inverse of model_config_to_json, the family read first. Every field
// of that family is required and type-checked (integers for the sizes,
// numbers for dropout, rope_theta and norm_eps, a boolean for bias), unknown
// keys are rejected (a field this build does not know could change the
// model), then the config's validate() runs. Errors are tessera::Error
// naming `source` (the file the JSON came from) and the field.
ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source);

// The run's settings (not read back: a record of how the weights were made):
// preset, seq_len, batch, grad_accum, steps, lr, min_lr_ratio, warmup,
// weight_decay, clip, seed, data, tokenizer, init_from, nproc, hsdp, tp, reshard_after_forward (a bool,
// or an int rank count), param_dtype, reduce_dtype (null: same as
// param_dtype), deterministic.
nlohmann::json train_config_to_json(const TrainConfig& config);

}  // namespace tessera::train
