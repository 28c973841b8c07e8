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
// imported model trains without dropout), token ids, initializer_range,
// use_cache, dtype (tessera keeps f32 parameters and converts on load), and
// Llama's tie_word_embeddings (a tied head loads into both tessera's
// embedding and its untied output, which export then writes untied).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "train/model_family.h"

namespace tessera::train {

// An imported model's settings beyond its shape.
struct HfModelInfo {
  ModelConfig config;
  bool tied_head = false;  // llama only: lm_head.weight is embed_tokens.weight (absent from the files)
};

// Throws tessera::Error naming `source` (the config.json read) and the key.
HfModelInfo hf_model_from_config(const nlohmann::json& config, const std::string& source);

// The config.json transformers reads back into the same model (the head
// written untied for a Llama), its "dtype" the parameters'.
nlohmann::ordered_json hf_config_from_model(const ModelConfig& config);

}  // namespace tessera::train
