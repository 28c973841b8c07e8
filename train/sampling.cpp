// Greedy, temperature, top-k and top-p sampling of one token.
#include "train/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace tessera::train {

namespace {

// Uniform in [0, 1) with 53 random bits from two Philox words: tail tokens of
// a large vocabulary have probabilities far below the 2^-24 step of
// philox_uniform and must still be reachable.
double uniform_double(tessera::PhiloxKey key, uint64_t draw) {
  const auto words = tessera::philox4x32(key, draw);
  const uint64_t bits = (static_cast<uint64_t>(words[0]) << 21) ^ (static_cast<uint64_t>(words[1]) >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

}  // namespace

void check_sampling_options(const SamplingOptions& options, int64_t vocab_size, const char* op) {
  TESSERA_CHECK(std::isfinite(options.temperature) && options.temperature >= 0.0,
                "{}: temperature must be finite and >= 0 (0 = greedy), got {}", op, options.temperature);
  TESSERA_CHECK(options.top_k >= 0 && options.top_k <= vocab_size,
                "{}: top_k must be in [0, vocab size {}] (0 = all), got {}", op, vocab_size, options.top_k);
  TESSERA_CHECK(options.top_p > 0.0 && options.top_p <= 1.0, "{}: top_p must be in (0, 1] (1 = all), got {}", op,
                options.top_p);
}

int64_t sample_token(const tessera::Tensor& logits_row, const SamplingOptions& options, uint64_t draw) {
  TESSERA_CHECK(logits_row.defined() && logits_row.dim() == 1 && logits_row.numel() >= 1 &&
                    tessera::is_floating(logits_row.dtype()),
                "sample_token: logits must be a non-empty 1-d floating tensor [V], got {} {}",
                logits_row.defined() ? logits_row.sizes() : tessera::Shape{},
                logits_row.defined() ? tessera::dtype_name(logits_row.dtype()) : "undefined");
  const int64_t vocab_size = logits_row.numel();
  check_sampling_options(options, vocab_size, "sample_token");
  const std::vector<double> logits = logits_row.to_vector<double>();
  for (int64_t i = 0; i < vocab_size; ++i) {
    const double logit = logits[static_cast<size_t>(i)];
    TESSERA_CHECK(!std::isnan(logit) && logit != std::numeric_limits<double>::infinity(),
                  "sample_token: logit {} of token {} is not a number a softmax can take", logit, i);
  }
  const auto best = std::max_element(logits.begin(), logits.end());  // the first of equal maxima
  TESSERA_CHECK(std::isfinite(*best), "sample_token: all {} logits are -inf: no token can be chosen", vocab_size);
  if (options.temperature == 0.0) return best - logits.begin();

  // The k largest logits, largest first; equal logits in index order.
  const int64_t k = options.top_k == 0 ? vocab_size : options.top_k;
  std::vector<int64_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&logits](int64_t a, int64_t b) {
    const double la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  });
  order.resize(static_cast<size_t>(k));

  // softmax(logits / T) over the candidates, unnormalised: exp((l - max) / T).
  std::vector<double> weights(order.size());
  double total = 0.0;
  for (size_t j = 0; j < order.size(); ++j) {
    const double logit = logits[static_cast<size_t>(order[j])];
    weights[j] = std::isinf(logit) ? 0.0 : std::exp((logit - *best) / options.temperature);
    total += weights[j];
  }
  // The nucleus: candidate j stays while the ones before it hold less than
  // top_p of the probability (the most likely one always stays).
  if (options.top_p < 1.0) {
    const double threshold = options.top_p * total;
    double kept = 0.0;
    size_t count = 0;
    while (count < weights.size() && weights[count] > 0.0 && (count == 0 || kept < threshold)) {
      kept += weights[count];
      ++count;
    }
    order.resize(count);
    weights.resize(count);
    total = kept;
  }
  // Inverse CDF; rounding can leave the target at the very end, where the
  // last candidate with any weight is the answer.
  const double target = uniform_double(options.key, draw) * total;
  double cumulative = 0.0;
  int64_t chosen = order.front();
  for (size_t j = 0; j < order.size(); ++j) {
    if (weights[j] == 0.0) continue;
    chosen = order[j];
    cumulative += weights[j];
    if (target < cumulative) break;
  }
  return chosen;
}

}  // namespace tessera::train
