// nn::LlamaConfig: presets, validation, parameter and FLOP counts.
#include "nn/models/llama_config.h"

#include <array>

#include "tensor/error.h"

namespace tessera::nn {

namespace {

struct LlamaPreset {
  const char* name;
  int64_t vocab_size, block_size, n_layer, n_head, n_kv_head, n_embd, ffn_hidden;
  double rope_theta;
};

constexpr std::array<LlamaPreset, 6> kLlamaPresets{{
    {"llama-nano", 256, 32, 1, 2, 1, 16, 48, 10000.0},
    {"llama-tiny", 256, 64, 2, 4, 2, 64, 192, 10000.0},
    {"llama-125m", 32000, 1024, 12, 12, 4, 768, 2048, 10000.0},
    {"llama2-7b", 32000, 4096, 32, 32, 32, 4096, 11008, 10000.0},
    {"llama3-8b", 128256, 8192, 32, 32, 8, 4096, 14336, 500000.0},
    {"llama3-70b", 128256, 8192, 80, 64, 8, 8192, 28672, 500000.0},
}};

}  // namespace

LlamaConfig LlamaConfig::preset(std::string_view name) {
  for (const LlamaPreset& preset : kLlamaPresets) {
    if (name != preset.name) continue;
    LlamaConfig config;
    config.vocab_size = preset.vocab_size;
    config.block_size = preset.block_size;
    config.n_layer = preset.n_layer;
    config.n_head = preset.n_head;
    config.n_kv_head = preset.n_kv_head;
    config.n_embd = preset.n_embd;
    config.ffn_hidden = preset.ffn_hidden;
    config.rope_theta = preset.rope_theta;
    return config;
  }
  fail("LlamaConfig: unknown preset '{}' (known: {})", name, preset_names());
}

std::vector<std::string> LlamaConfig::preset_names() {
  std::vector<std::string> names;
  for (const LlamaPreset& preset : kLlamaPresets) names.emplace_back(preset.name);
  return names;
}

void LlamaConfig::validate() const {
  TESSERA_CHECK(vocab_size > 0, "LlamaConfig: vocab_size must be positive, got {}", vocab_size);
  TESSERA_CHECK(block_size > 0, "LlamaConfig: block_size must be positive, got {}", block_size);
  TESSERA_CHECK(n_layer > 0, "LlamaConfig: n_layer must be positive, got {}", n_layer);
  TESSERA_CHECK(n_head > 0, "LlamaConfig: n_head must be positive, got {}", n_head);
  TESSERA_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "LlamaConfig: n_kv_head ({}) must divide n_head ({})",
                n_kv_head, n_head);
  TESSERA_CHECK(n_embd > 0 && n_embd % n_head == 0 && (n_embd / n_head) % 2 == 0,
                "LlamaConfig: n_embd ({}) must be a multiple of n_head ({}) with an even head_dim (RoPE rotates pairs)",
                n_embd, n_head);
  TESSERA_CHECK(ffn_hidden > 0, "LlamaConfig: ffn_hidden must be positive, got {}", ffn_hidden);
  TESSERA_CHECK(rope_theta > 1.0, "LlamaConfig: rope_theta must be greater than 1, got {}", rope_theta);
  TESSERA_CHECK(norm_eps > 0.0, "LlamaConfig: norm_eps must be positive, got {}", norm_eps);
  TESSERA_CHECK(dtype == DType::f32 || dtype == DType::f64, "LlamaConfig: dtype must be f32 or f64, got {}",
                dtype_name(dtype));
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t C = n_embd, kv = n_kv_head * head_dim();
  const int64_t block = 2 * C * C + 2 * C * kv + 3 * C * ffn_hidden + 2 * C;
  return 2 * vocab_size * C + n_layer * block + C;
}

double LlamaConfig::flops_per_token(int64_t seq_len) const {
  TESSERA_CHECK(seq_len > 0, "LlamaConfig::flops_per_token: seq_len must be positive, got {}", seq_len);
  const double n = static_cast<double>(num_parameters() - vocab_size * n_embd);
  return 6.0 * n + 12.0 * static_cast<double>(n_layer) * static_cast<double>(seq_len) * static_cast<double>(n_embd);
}

}  // namespace tessera::nn
