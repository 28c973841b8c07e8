// The GPT example's settings as JSON, the form checkpoints carry: the model
// shape (every nn::GPTConfig field: what `generate` needs to rebuild the model
// before loading its weights) and, for the record, the training run's
// settings. The training side stores them in a checkpoint's training_state as
// {"config": {"model": ..., "train": ...}} and in an exported .safetensors
// file's __metadata__ under kGptConfigMetadataKey (the model JSON as text,
// next to the step under kStepMetadataKey).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "examples/gpt/train_config.h"
#include "nn/models/gpt_config.h"

namespace gpt {

inline constexpr const char* kGptConfigMetadataKey = "tessera.gpt_config";
inline constexpr const char* kStepMetadataKey = "tessera.step";  // the training step, as decimal text

// {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 64,
//  "dropout": 0.0, "bias": true, "norm_eps": 1e-05}
nlohmann::json model_config_to_json(const tessera::nn::GPTConfig& config);

// The inverse. Every field is required and type-checked (integers for the
// sizes, numbers for dropout and norm_eps, a boolean for bias), unknown keys
// are rejected (a field this build does not know could change the model),
// then GPTConfig::validate() runs. Errors are tessera::Error naming `source`
// (the file the JSON came from) and the field.
tessera::nn::GPTConfig model_config_from_json(const nlohmann::json& json, const std::string& source);

// The run's settings (not read back: a record of how the weights were made):
// preset, seq_len, batch, grad_accum, steps, lr, min_lr_ratio, warmup,
// weight_decay, clip, seed, data, nproc, hsdp, reshard_after_forward (a bool,
// or an int rank count), param_dtype, reduce_dtype (null: same as
// param_dtype), deterministic.
nlohmann::json train_config_to_json(const TrainConfig& config);

}  // namespace gpt
