// Model configs (either family) <-> JSON with every field checked, and TrainConfig -> JSON.
#include "train/config_json.h"

#include <algorithm>
#include <array>
#include <limits>
#include <span>
#include <string_view>

#include "tensor/error.h"

namespace tessera::train {

namespace {

// A GPT's JSON may say "family": "gpt"; model_config_to_json leaves it out.
// "vocab_padding_multiple" is written only when it pads (absent: 1), so
// configs from before the padding read as they were.
constexpr std::array<std::string_view, 10> kGptFields = {"family",  "vocab_size", "block_size", "n_layer",
                                                         "n_head",  "n_embd",     "dropout",    "bias",
                                                         "norm_eps", "vocab_padding_multiple"};
constexpr const char* kVocabPaddingField = "vocab_padding_multiple";
constexpr std::array<std::string_view, 10> kLlamaFields = {"family",     "vocab_size", "block_size", "n_layer",
                                                           "n_head",     "n_kv_head",  "n_embd",     "ffn_hidden",
                                                           "rope_theta", "norm_eps"};
constexpr const char* kFamilyField = "family";

// The JSON type of a value, for "expected X, got Y" messages.
std::string json_kind(const nlohmann::json& value) {
  if (value.is_number_integer()) return fmt::format("integer {}", value.dump());
  if (value.is_number_float()) return fmt::format("number {}", value.dump());
  if (value.is_primitive()) return fmt::format("{} {}", value.type_name(), value.dump());
  return value.type_name();
}

const nlohmann::json& required_field(const nlohmann::json& json, std::string_view field, const std::string& source) {
  const auto found = json.find(field);
  TESSERA_CHECK(found != json.end(), "{}: model config: field '{}' is missing", source, field);
  return *found;
}

int64_t integer_field(const nlohmann::json& json, std::string_view field, const std::string& source) {
  const nlohmann::json& value = required_field(json, field, source);
  TESSERA_CHECK(value.is_number_integer(), "{}: model config: field '{}' must be an integer, got {}", source, field,
                json_kind(value));
  // nlohmann keeps integers above INT64_MAX as unsigned.
  TESSERA_CHECK(!value.is_number_unsigned() ||
                    value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                "{}: model config: field '{}' is out of range, got {}", source, field, value.dump());
  return value.get<int64_t>();
}

double number_field(const nlohmann::json& json, std::string_view field, const std::string& source) {
  const nlohmann::json& value = required_field(json, field, source);
  TESSERA_CHECK(value.is_number(), "{}: model config: field '{}' must be a number, got {}", source, field,
                json_kind(value));
  return value.get<double>();
}

bool boolean_field(const nlohmann::json& json, std::string_view field, const std::string& source) {
  const nlohmann::json& value = required_field(json, field, source);
  TESSERA_CHECK(value.is_boolean(), "{}: model config: field '{}' must be true or false, got {}", source, field,
                json_kind(value));
  return value.get<bool>();
}

// Every key must be one of `known`.
void check_known_fields(const nlohmann::json& json, std::span<const std::string_view> known,
                        const std::string& source) {
  for (const auto& [key, value] : json.items()) {
    TESSERA_CHECK(std::find(known.begin(), known.end(), key) != known.end(),
                  "{}: model config: unknown field '{}' (known: {})", source, key, known);
  }
}

// The config's own validate(), its message prefixed with the source.
template <typename Config>
Config validated(Config config, const std::string& source) {
  try {
    config.validate();
  } catch (const tessera::Error& error) {
    tessera::fail("{}: model config: {}", source, error.what());
  }
  return config;
}

tessera::nn::GPTConfig gpt_config_from_json(const nlohmann::json& json, const std::string& source) {
  check_known_fields(json, kGptFields, source);
  tessera::nn::GPTConfig config;
  config.vocab_size = integer_field(json, "vocab_size", source);
  config.block_size = integer_field(json, "block_size", source);
  config.n_layer = integer_field(json, "n_layer", source);
  config.n_head = integer_field(json, "n_head", source);
  config.n_embd = integer_field(json, "n_embd", source);
  config.dropout = number_field(json, "dropout", source);
  config.bias = boolean_field(json, "bias", source);
  config.norm_eps = number_field(json, "norm_eps", source);
  if (json.contains(kVocabPaddingField)) config.vocab_padding_multiple = integer_field(json, kVocabPaddingField, source);
  return validated(config, source);
}

tessera::nn::LlamaConfig llama_config_from_json(const nlohmann::json& json, const std::string& source) {
  check_known_fields(json, kLlamaFields, source);
  tessera::nn::LlamaConfig config;
  config.vocab_size = integer_field(json, "vocab_size", source);
  config.block_size = integer_field(json, "block_size", source);
  config.n_layer = integer_field(json, "n_layer", source);
  config.n_head = integer_field(json, "n_head", source);
  config.n_kv_head = integer_field(json, "n_kv_head", source);
  config.n_embd = integer_field(json, "n_embd", source);
  config.ffn_hidden = integer_field(json, "ffn_hidden", source);
  config.rope_theta = number_field(json, "rope_theta", source);
  config.norm_eps = number_field(json, "norm_eps", source);
  return validated(config, source);
}

}  // namespace

nlohmann::json model_config_to_json(const tessera::nn::GPTConfig& config) {
  nlohmann::json json = {{"vocab_size", config.vocab_size},
                         {"block_size", config.block_size},
                         {"n_layer", config.n_layer},
                         {"n_head", config.n_head},
                         {"n_embd", config.n_embd},
                         {"dropout", config.dropout},
                         {"bias", config.bias},
                         {"norm_eps", config.norm_eps}};
  if (config.vocab_padding_multiple != 1) json[kVocabPaddingField] = config.vocab_padding_multiple;
  return json;
}

nlohmann::json model_config_to_json(const tessera::nn::LlamaConfig& config) {
  return {{kFamilyField, family_name(ModelFamily::llama)},
          {"vocab_size", config.vocab_size},
          {"block_size", config.block_size},
          {"n_layer", config.n_layer},
          {"n_head", config.n_head},
          {"n_kv_head", config.n_kv_head},
          {"n_embd", config.n_embd},
          {"ffn_hidden", config.ffn_hidden},
          {"rope_theta", config.rope_theta},
          {"norm_eps", config.norm_eps}};
}

nlohmann::json model_config_to_json(const ModelConfig& config) {
  return std::visit([](const auto& shape) { return model_config_to_json(shape); }, config);
}

ModelFamily model_family_from_json(const nlohmann::json& json, const std::string& source) {
  TESSERA_CHECK(json.is_object(), "{}: model config must be a JSON object, got {}", source, json_kind(json));
  const auto family = json.find(kFamilyField);
  if (family == json.end()) return ModelFamily::gpt;
  TESSERA_CHECK(family->is_string(), "{}: model config: field 'family' must be a string, got {}", source,
                json_kind(*family));
  try {
    return family_from_name(family->get<std::string>());
  } catch (const tessera::Error& error) {
    tessera::fail("{}: model config: {}", source, error.what());
  }
}

ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source) {
  const ModelConfig config = model_family_from_json(json, source) == ModelFamily::llama
                                 ? ModelConfig(llama_config_from_json(json, source))
                                 : ModelConfig(gpt_config_from_json(json, source));
  try {
    validate(config);  // the trainer's bounds too
  } catch (const tessera::Error& error) {
    tessera::fail("{}: model config: {}", source, error.what());
  }
  return config;
}

nlohmann::json train_config_to_json(const TrainConfig& config) {
  // As FSDP2 writes it: a bool, or the group size.
  const std::optional<int64_t> reshard_group = config.reshard_after_forward.group_size();
  const nlohmann::json reshard =
      reshard_group ? nlohmann::json(*reshard_group) : nlohmann::json(config.reshard_after_forward.is_always());
  nlohmann::json reduce_dtype = nullptr;
  if (config.reduce_dtype) reduce_dtype = std::string(tessera::dtype_name(*config.reduce_dtype));
  return {{"preset", config.preset},
          {"seq_len", config.seq_len},
          {"batch", config.batch},
          {"grad_accum", config.grad_accum},
          {"grad_sync", grad_sync_name(config.grad_sync)},
          {"steps", config.steps},
          {"lr", config.lr},
          {"min_lr_ratio", config.min_lr_ratio},
          {"warmup", config.warmup},
          {"weight_decay", config.weight_decay},
          {"clip", config.clip},
          {"seed", config.seed},
          {"data", config.data},
          {"tokenizer", config.tokenizer},
          {"init_from", config.init_from},
          {"nproc", config.nproc},
          {"hsdp", config.hsdp},
          {"tp", config.tp},
          {"async_tp", config.async_tp},
          {"ac", config.ac.str()},
          {"float8", config.float8},
          {"lora_rank", config.lora_rank},
          {"lora_alpha", config.lora_scale_alpha()},
          {"nf4", config.nf4},
          {"reshard_after_forward", reshard},
          {"param_dtype", std::string(tessera::dtype_name(config.param_dtype))},
          {"reduce_dtype", reduce_dtype},
          {"deterministic", config.deterministic}};
}

}  // namespace tessera::train
