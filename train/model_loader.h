// A trained model (a GPT or a Llama) back from disk, for `generate`: from a checkpoint that
// `train` saved (on any number of ranks: it loads whole, in this one
// process), or from an exported .safetensors file. Either way the model's
// family and shape come from the file itself (config_json.h), so nothing
// about the model has to be repeated on the command line.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/models/causal_lm.h"
#include "train/model_family.h"

namespace tessera::train {

struct LoadedModel {
  std::unique_ptr<tessera::nn::CausalLM> model;  // on the CPU, unsharded, in eval mode
  ModelConfig config;                            // the family and shape the file records
  std::string source;                            // the checkpoint directory or .safetensors file read
  std::optional<int64_t> step;                   // the training step, when the file records it
  // A Hugging Face directory's eos ids (generation_config.json's, else
  // config.json's): where its generation ends by default. Empty otherwise.
  std::vector<int64_t> end_of_text_ids;
};

// `path` itself when it holds metadata.json (one checkpoint), else the
// newest complete step-N checkpoint under it (a root of checkpoints).
// Throws tessera::Error when it is neither.
std::string resolve_checkpoint_dir(const std::string& path);

// Reads training_state.config.model from the checkpoint's metadata.json,
// builds that model and loads its "model.*" entries (the optimizer's "optim.*"
// entries are skipped). Throws tessera::Error naming the checkpoint when the
// config is missing or malformed, when a parameter of the model is absent
// from the checkpoint (or the checkpoint holds model entries it lacks), or
// when its metadata's step is not the N of its step-N name, as `train` does
// (step_name_disagreement).
LoadedModel load_model_from_checkpoint(const std::string& path);

// Reads the model config from the file's __metadata__ "tessera.gpt_config"
// (and the step from "tessera.step" when present) and the parameters by their
// plain names. Throws tessera::Error naming the file when the config key is
// absent or not a valid config, the step is not a number, or the names or
// shapes do not match the model.
LoadedModel load_model_from_safetensors(const std::string& path);

// A Hugging Face model directory (GPT2LMHeadModel or LlamaForCausalLM:
// huggingface/hf_checkpoint.h): the config from its config.json, the
// weights from its model.safetensors or shards, the eos ids from its
// generation_config.json or config.json. No step is recorded.
LoadedModel load_model_from_hf_dir(const std::string& dir);

// --init-from's source: a Hugging Face model directory, else an exported .safetensors file.
LoadedModel load_model_from_export(const std::string& path);

}  // namespace tessera::train
