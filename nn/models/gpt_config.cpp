// nn::GPTConfig: presets, validation, parameter and FLOP counts.
#include "nn/models/gpt_config.h"

#include <array>

#include "tensor/error.h"

namespace tessera::nn {

namespace {

struct GPTPreset {
  const char* name;
  int64_t vocab_size, block_size, n_layer, n_head, n_embd, vocab_padding_multiple;
};

// GPT-2's vocabulary is padded as llm.c pads it (50304 rows); the byte-level
// models' 256 is aligned already.
constexpr std::array<GPTPreset, 6> kGPTPresets{{
    {"nano", 256, 32, 1, 2, 16, 1},
    {"tiny", 256, 64, 2, 2, 64, 1},
    {"gpt2-124m", 50257, 1024, 12, 12, 768, 128},
    {"gpt2-350m", 50257, 1024, 24, 16, 1024, 128},
    {"gpt2-774m", 50257, 1024, 36, 20, 1280, 128},
    {"gpt2-1558m", 50257, 1024, 48, 25, 1600, 128},
}};

// Alignment never asks for more (GEMM tiles want 8 to 128); the bound also
// keeps the rounding up far from overflow.
constexpr int64_t kMaxVocabPaddingMultiple = 1024;

}  // namespace

GPTConfig GPTConfig::preset(std::string_view name) {
  for (const GPTPreset& preset : kGPTPresets) {
    if (name == preset.name) {
      GPTConfig config;
      config.vocab_size = preset.vocab_size;
      config.block_size = preset.block_size;
      config.n_layer = preset.n_layer;
      config.n_head = preset.n_head;
      config.n_embd = preset.n_embd;
      config.vocab_padding_multiple = preset.vocab_padding_multiple;
      return config;
    }
  }
  fail("GPTConfig: unknown preset '{}' (known: {})", name, preset_names());
}

std::vector<std::string> GPTConfig::preset_names() {
  std::vector<std::string> names;
  for (const GPTPreset& preset : kGPTPresets) names.emplace_back(preset.name);
  return names;
}

void GPTConfig::validate() const {
  TESSERA_CHECK(vocab_size > 0, "GPTConfig: vocab_size must be positive, got {}", vocab_size);
  TESSERA_CHECK(vocab_padding_multiple >= 1 && vocab_padding_multiple <= kMaxVocabPaddingMultiple,
                "GPTConfig: vocab_padding_multiple must be in [1, {}], got {}", kMaxVocabPaddingMultiple,
                vocab_padding_multiple);
  TESSERA_CHECK(block_size > 0, "GPTConfig: block_size must be positive, got {}", block_size);
  TESSERA_CHECK(n_layer > 0, "GPTConfig: n_layer must be positive, got {}", n_layer);
  TESSERA_CHECK(n_head > 0, "GPTConfig: n_head must be positive, got {}", n_head);
  TESSERA_CHECK(n_embd > 0 && n_embd % n_head == 0, "GPTConfig: n_embd ({}) must be a positive multiple of n_head ({})",
                n_embd, n_head);
  TESSERA_CHECK(dropout >= 0.0 && dropout < 1.0, "GPTConfig: dropout must be in [0, 1), got {}", dropout);
  TESSERA_CHECK(norm_eps > 0.0, "GPTConfig: norm_eps must be positive, got {}", norm_eps);
  TESSERA_CHECK(dtype == DType::f32 || dtype == DType::f64, "GPTConfig: dtype must be f32 or f64, got {}",
                dtype_name(dtype));
}

int64_t GPTConfig::padded_vocab_size() const {
  return (vocab_size + vocab_padding_multiple - 1) / vocab_padding_multiple * vocab_padding_multiple;
}

int64_t GPTConfig::num_parameters() const {
  const int64_t C = n_embd;
  const int64_t norm = bias ? 2 * C : C;                         // weight (+ bias)
  const int64_t linear_biases = bias ? 3 * C + C + 4 * C + C : 0;  // qkv, proj, fc, mlp proj
  const int64_t block = 2 * norm + 12 * C * C + linear_biases;  // qkv 3C^2, proj C^2, fc 4C^2, proj 4C^2
  return padded_vocab_size() * C + block_size * C + n_layer * block + norm;
}

double GPTConfig::flops_per_token(int64_t seq_len) const {
  TESSERA_CHECK(seq_len > 0, "GPTConfig::flops_per_token: seq_len must be positive, got {}", seq_len);
  const double n =
      static_cast<double>(num_parameters() - block_size * n_embd - (padded_vocab_size() - vocab_size) * n_embd);
  return 6.0 * n + 12.0 * static_cast<double>(n_layer) * static_cast<double>(seq_len) * static_cast<double>(n_embd);
}

}  // namespace tessera::nn
