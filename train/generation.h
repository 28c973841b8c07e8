// The autoregressive loop of `generate`: a batch of prompts continued token by
// token from a language model (GPT, Llama: any nn::CausalLM), with a KV cache
// (the default: the prompts run through the model once, in one prefill, then
// each step runs only the new tokens) or without one (each step runs the model
// over every sequence's whole context: the reference the cache is held to).
// Tokens are uint32: Llama 3's vocabulary has 128,256 of them.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/models/causal_lm.h"
#include "train/sampling.h"

namespace tessera::train {

struct GenerationOptions {
  int64_t max_new_tokens = 200;
  // Sequence b of the batch draws from stream sampling.key.stream + b (new
  // token i uses draw i): the first prompt of a batch gets the text it gets
  // alone, and equal prompts get different texts.
  SamplingOptions sampling{};
  // A sequence ends with the first of these it samples (kept as its last token).
  std::vector<uint32_t> stop_tokens{};
  bool kv_cache = true;
};

struct GeneratedSequence {
  std::vector<uint32_t> tokens;  // the prompt, then the new tokens
  int64_t prompt_length = 0;
  bool stopped = false;  // ended on a stop token
};

// Continues every prompt by up to options.max_new_tokens tokens. The model
// sees the last block_size tokens of a sequence (positions beyond it have no
// position embedding or rotary angles): with the cache, the prompts' windows
// are left-padded into one batch (nn::KVCache's padding: each sequence's
// positions start at its first token), and once the longest reaches
// block_size each further step fills the cache again from the windows (a
// cacheless step's cost, for the same context). Without the cache, each
// sequence runs alone. Runs without the graph (NoGradGuard), in eval mode (no
// dropout); the model's train/eval mode is restored afterwards. Throws
// tessera::Error for no prompts, an empty prompt, a prompt or stop token >=
// vocab_size, max_new_tokens < 0 and bad sampling options (checked before the
// first step, so also when max_new_tokens is 0).
std::vector<GeneratedSequence> generate(tessera::nn::CausalLM& model, const std::vector<std::vector<uint32_t>>& prompts,
                                        const GenerationOptions& options);

}  // namespace tessera::train
