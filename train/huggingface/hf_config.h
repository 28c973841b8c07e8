// A Hugging Face config.json <-> the trainer's ModelConfig, for the two
// architectures tessera has: GPT2LMHeadModel ("model_type": "gpt2") and
// LlamaForCausalLM ("llama").
//
// What maps:
//   gpt2:  vocab_size, n_positions -> block_size, n_embd, n_layer, n_head,
//          layer_norm_epsilon -> norm_eps; biases always.
//   llama: vocab_size, max_position_embeddings -> block_size, hidden_size,
//          num_hidden_layers, num_attention_heads, num_key_value_heads,
//          intermediate_size -> ffn_hidden, rms_norm_eps, rope_theta (top
//          level, or rope_parameters.rope_theta as transformers 5 writes it).
// What is refused, naming the key, because tessera's model would compute
// something else: another model_type; gpt2's n_inner other than 4 * n_embd,
// an activation other than gelu_new (tanh GELU), scale_attn_weights false,
// scale_attn_by_inverse_layer_idx, cross-attention, an untied head; llama's
// rope_scaling or a rope_type other than "default", attention or MLP biases,
// an activation other than silu, head_dim other than hidden_size /
// num_attention_heads.
// What is read and not mapped: dropout probabilities (*_pdrop,
// attention_dropout: training settings, not part of the function; an
// imported model trains without dropout), initializer_range,
// use_cache, dtype (tessera keeps f32 parameters and converts on load), and
// Llama's tie_word_embeddings (a tied head loads into both tessera's
// embedding and its untied output, which export then writes untied).
// The token ids (bos_token_id, eos_token_id, pad_token_id) are read, checked
// against vocab_size and kept for the export (hf_companion_files.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/model_family.h"

namespace tessera::train {

// One token-id key of config.json or generation_config.json: absent or null,
// one id, or a list of ids (Llama 3 lists its eos ids: end_of_text and eot).
struct HfTokenId {
  std::vector<int64_t> ids;  // empty: null
  bool is_list = false;      // written back as a list, even of one id

  bool known() const { return !ids.empty(); }
  nlohmann::ordered_json to_json() const;  // null, the id, or the list
  bool operator==(const HfTokenId&) const = default;
};

struct HfTokenIds {
  HfTokenId bos, eos, pad;
  bool operator==(const HfTokenIds&) const = default;
};

// An imported model's settings beyond its shape.
struct HfModelInfo {
  ModelConfig config;
  bool tied_head = false;  // llama only: lm_head.weight is embed_tokens.weight (absent from the files)
  HfTokenIds token_ids;    // transformers' generate stops at eos and pads with pad
};

// Throws tessera::Error naming `source` (the config.json read) and the key.
HfModelInfo hf_model_from_config(const nlohmann::json& config, const std::string& source);

// bos_token_id, eos_token_id and pad_token_id of a config.json or a
// generation_config.json (`json`, an object). Throws tessera::Error naming
// `source` and the key for a value that is not null, an integer or a list of
// integers, and for an id outside [0, vocab_size).
HfTokenIds hf_token_ids_from_json(const nlohmann::json& json, int64_t vocab_size, const std::string& source);

// The config.json transformers reads back into the same model (the head
// written untied for a Llama), its "dtype" the parameters', with `token_ids`
// (null where unknown: a byte-level model has none).
nlohmann::ordered_json hf_config_from_model(const ModelConfig& config, const HfTokenIds& token_ids = {});

}  // namespace tessera::train
