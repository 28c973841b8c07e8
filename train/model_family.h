// The model families the trainer trains and samples (`train --model gpt |
// llama`), and the one place that answers every question whose answer
// depends on the family: its presets, its vocabulary, context, depth,
// parameter and FLOP counts, its one-line description, and building it. The
// rest of the trainer holds a ModelConfig and a nn::CausalLM and asks here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "nn/models/causal_lm.h"
#include "nn/models/gpt_config.h"
#include "nn/models/llama_config.h"
#include "tensor/device.h"

namespace tessera::train {

enum class ModelFamily { gpt, llama };

// One model's shape, of either family.
using ModelConfig = std::variant<tessera::nn::GPTConfig, tessera::nn::LlamaConfig>;

// "gpt", "llama": the names --model and the config JSON's "family" take.
std::vector<std::string> family_names();
std::string family_name(ModelFamily family);
// Throws tessera::Error listing the known names.
ModelFamily family_from_name(std::string_view name);
ModelFamily family_of(const ModelConfig& config);

// "tiny" for gpt, "llama-tiny" for llama: each trains on a CPU in seconds.
std::string default_preset(ModelFamily family);
std::vector<std::string> preset_names(ModelFamily family);
// Throws tessera::Error when `preset` is not one of the family's, listing them
// (and naming the family a preset of another one belongs to).
ModelConfig preset_config(ModelFamily family, std::string_view preset);

int64_t vocab_size(const ModelConfig& config);
// The rows of the embedding and head: vocab_size plus a GPT's padding.
int64_t padded_vocab_size(const ModelConfig& config);
int64_t block_size(const ModelConfig& config);  // the longest sequence the model takes
int64_t n_layer(const ModelConfig& config);
tessera::DType parameter_dtype(const ModelConfig& config);
int64_t num_parameters(const ModelConfig& config);
double flops_per_token(const ModelConfig& config, int64_t seq_len);  // training: forward + backward
// The trainer's bounds on a model's shape, for its flags and for the configs
// it reads from files (a checkpoint's, an export's): far beyond the presets
// (Llama 3's vocab is 128256), finite, so that neither a typo nor an edited
// file can ask for an unbounded model.
inline constexpr int64_t kMaxModelWidth = 1 << 20;   // n_embd, ffn_hidden, vocab, block_size
inline constexpr int64_t kMaxLayersOrHeads = 4096;   // n_layer, n_head, n_kv_head

// Throws tessera::Error naming the first inconsistent field, or one beyond
// the bounds above.
void validate(const ModelConfig& config);

// "n_layer 2, n_head 2, n_embd 64, vocab 256, context 64" for a GPT; a Llama
// adds its kv heads and SwiGLU width: "n_layer 2, n_head 4, n_kv_head 2,
// n_embd 64, F 192, vocab 256, context 64".
std::string describe_shape(const ModelConfig& config);

// The model on `device` (meta: nothing allocated; else initialised from the
// thread's default generator, as nn::GPT and nn::Llama do).
std::unique_ptr<tessera::nn::CausalLM> build_model(const ModelConfig& config, tessera::Device device);

}  // namespace tessera::train
