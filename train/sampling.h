// Sampling one token from a row of logits: greedy, or a softmax at a
// temperature over the k most likely tokens, cut to the nucleus (top-p) of
// them. The random draws come from Philox, so a token depends only on the
// logits, the options and the draw index: the same seed gives the same text on
// any machine. The autoregressive loop is generation.h.
#pragma once

#include <cstdint>

#include "tensor/philox.h"
#include "tensor/tensor.h"

namespace tessera::train {

struct SamplingOptions {
  double temperature = 0.8;  // 0 = greedy (argmax); else logits / temperature
  int64_t top_k = 40;        // sample among the k largest logits; 0 = the whole vocabulary
  // Nucleus sampling (Holtzman et al. 2019), in (0, 1]: of the top_k
  // candidates, the fewest most likely whose probabilities sum to top_p or
  // more (Hugging Face's TopPLogitsWarper); 1 = all of them.
  double top_p = 1.0;
  tessera::PhiloxKey key{};  // the draws' sequence (generation.h: one stream per sequence of a batch)
};

// Throws tessera::Error, naming `op`, for a temperature that is negative or
// not finite, top_k outside [0, vocab_size], top_p outside (0, 1].
void check_sampling_options(const SamplingOptions& options, int64_t vocab_size, const char* op);

// One token from `logits_row` ([V], floating): with temperature 0 the argmax
// (the lowest index among equal maxima); otherwise token i with probability
// softmax(logits / temperature)_i renormalised over the top_k largest logits
// (ties at the boundary broken by lower index), then over the top-p nucleus
// of those, picked by inverse CDF with uniform number `draw` of options.key.
// A logit of -inf is a token never chosen. Throws tessera::Error for bad
// options (check_sampling_options), NaN or +inf logits, or no finite logit.
int64_t sample_token(const tessera::Tensor& logits_row, const SamplingOptions& options, uint64_t draw);

}  // namespace tessera::train
