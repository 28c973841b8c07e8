// The family questions, each a visit over the two configs: the fields they
// share (vocab_size, block_size, n_layer, dtype and the counts) have the same
// names in both, so most answers are one generic lambda.
#include "train/model_family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "tensor/error.h"

namespace tessera::train {

using tessera::nn::GPTConfig;
using tessera::nn::LlamaConfig;

namespace {

constexpr ModelFamily kFamilies[] = {ModelFamily::gpt, ModelFamily::llama};

bool is_preset_of(ModelFamily family, std::string_view preset) {
  const std::vector<std::string> names = preset_names(family);
  return std::find(names.begin(), names.end(), preset) != names.end();
}

std::string shape_of(const GPTConfig& c) {
  return fmt::format("n_layer {}, n_head {}, n_embd {}, vocab {}, context {}", c.n_layer, c.n_head, c.n_embd,
                     c.vocab_size, c.block_size);
}

std::string shape_of(const LlamaConfig& c) {
  return fmt::format("n_layer {}, n_head {}, n_kv_head {}, n_embd {}, F {}, vocab {}, context {}", c.n_layer, c.n_head,
                     c.n_kv_head, c.n_embd, c.ffn_hidden, c.vocab_size, c.block_size);
}

std::unique_ptr<tessera::nn::CausalLM> model_of(const GPTConfig& config, tessera::Device device) {
  return std::make_unique<tessera::nn::GPT>(config, device);
}

std::unique_ptr<tessera::nn::CausalLM> model_of(const LlamaConfig& config, tessera::Device device) {
  return std::make_unique<tessera::nn::Llama>(config, device);
}

}  // namespace

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const ModelFamily family : kFamilies) names.push_back(family_name(family));
  return names;
}

std::string family_name(ModelFamily family) { return family == ModelFamily::gpt ? "gpt" : "llama"; }

ModelFamily family_from_name(std::string_view name) {
  for (const ModelFamily family : kFamilies) {
    if (name == family_name(family)) return family;
  }
  tessera::fail("unknown model family '{}' (known: {})", name, fmt::join(family_names(), ", "));
}

ModelFamily family_of(const ModelConfig& config) {
  return std::holds_alternative<GPTConfig>(config) ? ModelFamily::gpt : ModelFamily::llama;
}

std::string default_preset(ModelFamily family) { return family == ModelFamily::gpt ? "tiny" : "llama-tiny"; }

std::vector<std::string> preset_names(ModelFamily family) {
  return family == ModelFamily::gpt ? GPTConfig::preset_names() : LlamaConfig::preset_names();
}

ModelConfig preset_config(ModelFamily family, std::string_view preset) {
  if (!is_preset_of(family, preset)) {
    std::string owner;
    for (const ModelFamily other : kFamilies) {
      if (other != family && is_preset_of(other, preset)) {
        owner = fmt::format("; {} is a {} preset: pass --model {}", preset, family_name(other), family_name(other));
      }
    }
    tessera::fail("--preset: {} not in {{{}}} (the {} presets){}", preset, fmt::join(preset_names(family), ","),
                  family_name(family), owner);
  }
  if (family == ModelFamily::gpt) return GPTConfig::preset(preset);
  return LlamaConfig::preset(preset);
}

int64_t vocab_size(const ModelConfig& config) {
  return std::visit([](const auto& shape) { return shape.vocab_size; }, config);
}

int64_t padded_vocab_size(const ModelConfig& config) {
  if (const auto* gpt = std::get_if<GPTConfig>(&config)) return gpt->padded_vocab_size();
  return vocab_size(config);  // Llama's vocabularies (32000, 128256) are aligned already
}

int64_t block_size(const ModelConfig& config) {
  return std::visit([](const auto& shape) { return shape.block_size; }, config);
}

int64_t n_layer(const ModelConfig& config) {
  return std::visit([](const auto& shape) { return shape.n_layer; }, config);
}

tessera::DType parameter_dtype(const ModelConfig& config) {
  return std::visit([](const auto& shape) { return shape.dtype; }, config);
}

int64_t num_parameters(const ModelConfig& config) {
  return std::visit([](const auto& shape) { return shape.num_parameters(); }, config);
}

double flops_per_token(const ModelConfig& config, int64_t seq_len) {
  return std::visit([seq_len](const auto& shape) { return shape.flops_per_token(seq_len); }, config);
}

void validate(const ModelConfig& config) {
  std::visit(
      [](const auto& shape) {
        shape.validate();
        for (const auto& [field, value] : {std::pair{"n_embd", shape.n_embd}, std::pair{"vocab_size", shape.vocab_size},
                                           std::pair{"block_size", shape.block_size}}) {
          TESSERA_CHECK(value <= kMaxModelWidth, "{} must be at most {}, got {}", field, kMaxModelWidth, value);
        }
        for (const auto& [field, value] : {std::pair{"n_layer", shape.n_layer}, std::pair{"n_head", shape.n_head}}) {
          TESSERA_CHECK(value <= kMaxLayersOrHeads, "{} must be at most {}, got {}", field, kMaxLayersOrHeads, value);
        }
      },
      config);
  if (const auto* llama = std::get_if<tessera::nn::LlamaConfig>(&config)) {
    TESSERA_CHECK(llama->ffn_hidden <= kMaxModelWidth, "ffn_hidden must be at most {}, got {}", kMaxModelWidth,
                  llama->ffn_hidden);
    TESSERA_CHECK(llama->n_kv_head <= kMaxLayersOrHeads, "n_kv_head must be at most {}, got {}", kMaxLayersOrHeads,
                  llama->n_kv_head);
  }
}

std::string describe_shape(const ModelConfig& config) {
  return std::visit([](const auto& shape) { return shape_of(shape); }, config);
}

std::unique_ptr<tessera::nn::CausalLM> build_model(const ModelConfig& config, tessera::Device device) {
  return std::visit([device](const auto& shape) { return model_of(shape, device); }, config);
}

}  // namespace tessera::train
