// Sampling text from a language model (GPT, Llama: any nn::CausalLM): one token from a row of logits (greedy, or a
// softmax at a temperature over the k most likely tokens), and the
// autoregressive loop that feeds each sampled token back in. The random draws
// come from Philox, so a continuation depends only on the model, the prompt
// and the key: the same seed gives the same text on any machine.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/models/causal_lm.h"
#include "tensor/philox.h"

namespace gpt {

struct SamplingOptions {
  double temperature = 0.8;  // 0 = greedy (argmax); else logits / temperature
  int64_t top_k = 40;        // sample among the k largest logits; 0 = the whole vocabulary
  tessera::PhiloxKey key;    // new token i uses uniform draw i of this key
};

// One token from `logits_row` ([V], floating): with temperature 0 the argmax
// (the lowest index among equal maxima); otherwise token i with probability
// softmax(logits / temperature)_i renormalised over the top_k largest logits
// (ties at the boundary broken by lower index), picked by inverse CDF with
// uniform number `draw` of `key`. A logit of -inf is a token never chosen.
// Throws tessera::Error for a temperature that is negative or not finite,
// top_k < 0 or > V, NaN or +inf logits, or no finite logit.
int64_t sample_token(const tessera::Tensor& logits_row, double temperature, int64_t top_k, tessera::PhiloxKey key,
                     uint64_t draw);

// Appends `max_new_tokens` sampled tokens to `prompt` and returns the whole
// sequence. Each step runs the model without the graph (NoGradGuard), in eval
// mode (no dropout), on the last block_size tokens; the model's train/eval
// mode is restored afterwards. Throws tessera::Error for an empty prompt, a
// prompt token >= vocab_size, max_new_tokens < 0, a vocabulary too large for
// uint16 tokens, and the sampling options sample_token rejects (checked before
// the first step, so also when max_new_tokens is 0).
std::vector<uint16_t> generate_tokens(tessera::nn::CausalLM& model, std::vector<uint16_t> prompt,
                                      int64_t max_new_tokens, const SamplingOptions& options);

}  // namespace gpt
