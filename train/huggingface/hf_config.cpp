// config.json of GPT2LMHeadModel and LlamaForCausalLM <-> GPTConfig and LlamaConfig.
#include "train/huggingface/hf_config.h"

#include <cmath>
#include <optional>

#include "tensor/error.h"

namespace tessera::train {

namespace {

using tessera::nn::GPTConfig;
using tessera::nn::LlamaConfig;

// Reads keys of one config.json, every message naming the file and the key.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& json, std::string source) : json_(json), source_(std::move(source)) {
    TESSERA_CHECK(json_.is_object(), "{}: expected a JSON object, got {}", source_, json_.type_name());
  }

  // Absent and null read alike: transformers writes null for "use the default".
  const nlohmann::json* find(const std::string& key) const {
    const auto found = json_.find(key);
    return found == json_.end() || found->is_null() ? nullptr : &*found;
  }

  int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) {
      TESSERA_CHECK(fallback.has_value(), "{}: key \"{}\" is missing", source_, key);
      return *fallback;
    }
    TESSERA_CHECK(value->is_number_integer(), "{}: \"{}\" must be an integer, got {}", source_, key, value->dump());
    TESSERA_CHECK(!value->is_number_unsigned() || value->get<uint64_t>() <= uint64_t{1} << 62,
                  "{}: \"{}\" is out of range: {}", source_, key, value->dump());
    const int64_t number = value->get<int64_t>();
    TESSERA_CHECK(number >= 1 && number <= kMaxModelWidth, "{}: \"{}\" must be in [1, {}], got {}", source_, key,
                  kMaxModelWidth, number);
    return number;
  }

  double number(const std::string& key, double fallback) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) return fallback;
    TESSERA_CHECK(value->is_number(), "{}: \"{}\" must be a number, got {}", source_, key, value->dump());
    const double number = value->get<double>();
    TESSERA_CHECK(std::isfinite(number) && number > 0.0, "{}: \"{}\" must be a positive number, got {}", source_, key,
                  value->dump());
    return number;
  }

  bool boolean(const std::string& key, bool fallback) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) return fallback;
    TESSERA_CHECK(value->is_boolean(), "{}: \"{}\" must be true or false, got {}", source_, key, value->dump());
    return value->get<bool>();
  }

  std::string text(const std::string& key, const std::string& fallback) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr) return fallback;
    TESSERA_CHECK(value->is_string(), "{}: \"{}\" must be a string, got {}", source_, key, value->dump());
    return value->get<std::string>();
  }

  // Refuses a key whose value would make the model compute something tessera's does not.
  [[noreturn]] void refuse(const std::string& key, const std::string& why) const {
    const nlohmann::json* value = find(key);
    tessera::fail("{}: \"{}\": {} cannot be imported: {}", source_, key, value ? value->dump() : "null", why);
  }

  const std::string& source() const { return source_; }

 private:
  const nlohmann::json& json_;
  std::string source_;
};

HfModelInfo gpt2_from_config(const ConfigReader& reader) {
  GPTConfig config;
  config.vocab_size = reader.integer("vocab_size");
  config.block_size = reader.integer("n_positions");
  config.n_embd = reader.integer("n_embd");
  config.n_layer = reader.integer("n_layer");
  config.n_head = reader.integer("n_head");
  config.norm_eps = reader.number("layer_norm_epsilon", 1e-5);
  config.bias = true;
  config.dropout = 0.0;
  if (reader.find("n_inner") && reader.integer("n_inner") != 4 * config.n_embd) {
    reader.refuse("n_inner", fmt::format("tessera's GPT MLP is 4 * n_embd = {} wide", 4 * config.n_embd));
  }
  const std::string activation = reader.text("activation_function", "gelu_new");
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    reader.refuse("activation_function", "tessera's GPT MLP uses the tanh GELU (gelu_new)");
  }
  if (!reader.boolean("scale_attn_weights", true)) {
    reader.refuse("scale_attn_weights", "tessera's attention always scales by 1/sqrt(head_dim)");
  }
  if (reader.boolean("scale_attn_by_inverse_layer_idx", false)) {
    reader.refuse("scale_attn_by_inverse_layer_idx", "tessera's attention does not scale by layer");
  }
  if (reader.boolean("add_cross_attention", false)) {
    reader.refuse("add_cross_attention", "tessera's GPT is a decoder without cross-attention");
  }
  if (!reader.boolean("tie_word_embeddings", true)) {
    reader.refuse("tie_word_embeddings", "tessera's GPT head is always wte (tied)");
  }
  return {config, false, {}};
}

HfModelInfo llama_from_config(const ConfigReader& reader) {
  LlamaConfig config;
  config.vocab_size = reader.integer("vocab_size");
  config.block_size = reader.integer("max_position_embeddings");
  config.n_embd = reader.integer("hidden_size");
  config.n_layer = reader.integer("num_hidden_layers");
  config.n_head = reader.integer("num_attention_heads");
  config.n_kv_head = reader.integer("num_key_value_heads", config.n_head);
  config.ffn_hidden = reader.integer("intermediate_size");
  config.norm_eps = reader.number("rms_norm_eps", 1e-6);
  config.rope_theta = reader.number("rope_theta", 10000.0);
  if (const nlohmann::json* rope = reader.find("rope_parameters")) {
    const ConfigReader parameters(*rope, reader.source() + " rope_parameters");
    if (parameters.text("rope_type", "default") != "default") {
      parameters.refuse("rope_type", "tessera's RoPE is the unscaled one (rope_type \"default\")");
    }
    config.rope_theta = parameters.number("rope_theta", config.rope_theta);
  }
  if (reader.find("rope_scaling")) reader.refuse("rope_scaling", "tessera's RoPE is unscaled");
  if (reader.boolean("attention_bias", false)) reader.refuse("attention_bias", "tessera's Llama has no biases");
  if (reader.boolean("mlp_bias", false)) reader.refuse("mlp_bias", "tessera's Llama has no biases");
  if (reader.text("hidden_act", "silu") != "silu") reader.refuse("hidden_act", "tessera's SwiGLU gates with silu");
  if (reader.find("head_dim") && reader.integer("head_dim") * config.n_head != config.n_embd) {
    reader.refuse("head_dim", fmt::format("tessera's heads are hidden_size / num_attention_heads = {} wide",
                                          config.n_embd / config.n_head));
  }
  return {config, reader.boolean("tie_word_embeddings", false), {}};
}

// One token-id key: null or absent, an integer, or a list of integers, each in [0, vocab_size).
HfTokenId token_id_from_json(const nlohmann::json& json, const std::string& key, int64_t vocab_size,
                             const std::string& source) {
  HfTokenId token;
  const auto found = json.find(key);
  if (found == json.end() || found->is_null()) return token;
  token.is_list = found->is_array();
  const nlohmann::json values = token.is_list ? *found : nlohmann::json::array({*found});
  for (const nlohmann::json& value : values) {
    TESSERA_CHECK(value.is_number_integer(), "{}: \"{}\" must be a token id or a list of them, got {}", source, key,
                  found->dump());
    TESSERA_CHECK(value.is_number_unsigned() && value.get<uint64_t>() < static_cast<uint64_t>(vocab_size),
                  "{}: \"{}\": token id {} is outside the vocabulary [0, {})", source, key, value.dump(), vocab_size);
    token.ids.push_back(value.get<int64_t>());
  }
  return token;
}

std::string hf_dtype_name(tessera::DType dtype) {
  switch (dtype) {
    case tessera::DType::f32: return "float32";
    case tessera::DType::f64: return "float64";
    case tessera::DType::bf16: return "bfloat16";
    case tessera::DType::f16: return "float16";
    default: tessera::fail("hf_config_from_model: parameters of dtype {} have no torch dtype", dtype_name(dtype));
  }
}

}  // namespace

HfModelInfo hf_model_from_config(const nlohmann::json& json, const std::string& source) {
  const ConfigReader reader(json, source);
  const std::string model_type = reader.text("model_type", "");
  HfModelInfo info;
  if (model_type == "gpt2") {
    info = gpt2_from_config(reader);
  } else if (model_type == "llama") {
    info = llama_from_config(reader);
  } else {
    reader.refuse("model_type", "tessera imports \"gpt2\" (GPT2LMHeadModel) and \"llama\" (LlamaForCausalLM)");
  }
  try {
    validate(info.config);
  } catch (const tessera::Error& error) {
    tessera::fail("{}: the model it describes is not one tessera builds: {}", source, error.what());
  }
  info.token_ids = hf_token_ids_from_json(json, vocab_size(info.config), source);
  return info;
}

nlohmann::ordered_json HfTokenId::to_json() const {
  if (is_list) return ids;
  return ids.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(ids.front());
}

HfTokenIds hf_token_ids_from_json(const nlohmann::json& json, int64_t vocab_size, const std::string& source) {
  TESSERA_CHECK(json.is_object(), "{}: expected a JSON object, got {}", source, json.type_name());
  return {token_id_from_json(json, "bos_token_id", vocab_size, source),
          token_id_from_json(json, "eos_token_id", vocab_size, source),
          token_id_from_json(json, "pad_token_id", vocab_size, source)};
}

nlohmann::ordered_json hf_config_from_model(const ModelConfig& model, const HfTokenIds& token_ids) {
  nlohmann::ordered_json json;
  if (const auto* config = std::get_if<GPTConfig>(&model)) {
    json = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", config->vocab_size},
            {"n_positions", config->block_size},
            {"n_embd", config->n_embd},
            {"n_layer", config->n_layer},
            {"n_head", config->n_head},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", config->norm_eps},
            {"resid_pdrop", config->dropout},
            {"embd_pdrop", config->dropout},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false},
            {"add_cross_attention", false},
            {"tie_word_embeddings", true},
            {"bos_token_id", token_ids.bos.to_json()},
            {"eos_token_id", token_ids.eos.to_json()},
            {"pad_token_id", token_ids.pad.to_json()},
            {"dtype", hf_dtype_name(config->dtype)}};
  } else {
    const auto& llama = std::get<LlamaConfig>(model);
    json = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", llama.vocab_size},
            {"max_position_embeddings", llama.block_size},
            {"hidden_size", llama.n_embd},
            {"num_hidden_layers", llama.n_layer},
            {"num_attention_heads", llama.n_head},
            {"num_key_value_heads", llama.n_kv_head},
            {"head_dim", llama.head_dim()},
            {"intermediate_size", llama.ffn_hidden},
            {"hidden_act", "silu"},
            {"rms_norm_eps", llama.norm_eps},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", llama.rope_theta}}},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"attention_dropout", 0.0},
            {"tie_word_embeddings", false},
            {"bos_token_id", token_ids.bos.to_json()},
            {"eos_token_id", token_ids.eos.to_json()},
            {"pad_token_id", token_ids.pad.to_json()},
            {"dtype", hf_dtype_name(llama.dtype)}};
  }
  return json;
}

}  // namespace tessera::train
