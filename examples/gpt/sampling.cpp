// Greedy / temperature / top-k sampling and the generation loop.
#include "examples/gpt/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace gpt {

namespace {

void check_sampling_options(double temperature, int64_t top_k, int64_t vocab_size, const char* op) {
  TESSERA_CHECK(std::isfinite(temperature) && temperature >= 0.0,
                "{}: temperature must be finite and >= 0 (0 = greedy), got {}", op, temperature);
  TESSERA_CHECK(top_k >= 0 && top_k <= vocab_size, "{}: top_k must be in [0, vocab size {}] (0 = all), got {}", op,
                vocab_size, top_k);
}

// Uniform in [0, 1) with 53 random bits from two Philox words: tail tokens of
// a large vocabulary have probabilities far below the 2^-24 step of
// philox_uniform and must still be reachable.
double uniform_double(tessera::PhiloxKey key, uint64_t draw) {
  const auto words = tessera::philox4x32(key, draw);
  const uint64_t bits = (static_cast<uint64_t>(words[0]) << 21) ^ (static_cast<uint64_t>(words[1]) >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

// Restores a module's train/eval mode when the scope ends (also on a throw).
class TrainingModeGuard {
 public:
  explicit TrainingModeGuard(tessera::nn::Module& module) : module_(module), was_training_(module.is_training()) {}
  ~TrainingModeGuard() { module_.train(was_training_); }
  TrainingModeGuard(const TrainingModeGuard&) = delete;
  TrainingModeGuard& operator=(const TrainingModeGuard&) = delete;

 private:
  tessera::nn::Module& module_;
  bool was_training_;
};

}  // namespace

int64_t sample_token(const tessera::Tensor& logits_row, double temperature, int64_t top_k, tessera::PhiloxKey key,
                     uint64_t draw) {
  TESSERA_CHECK(logits_row.defined() && logits_row.dim() == 1 && logits_row.numel() >= 1 &&
                    tessera::is_floating(logits_row.dtype()),
                "sample_token: logits must be a non-empty 1-d floating tensor [V], got {} {}",
                logits_row.defined() ? logits_row.sizes() : tessera::Shape{},
                logits_row.defined() ? tessera::dtype_name(logits_row.dtype()) : "undefined");
  const int64_t vocab_size = logits_row.numel();
  check_sampling_options(temperature, top_k, vocab_size, "sample_token");
  const std::vector<double> logits = logits_row.to_vector<double>();
  for (int64_t i = 0; i < vocab_size; ++i) {
    const double logit = logits[static_cast<size_t>(i)];
    TESSERA_CHECK(!std::isnan(logit) && logit != std::numeric_limits<double>::infinity(),
                  "sample_token: logit {} of token {} is not a number a softmax can take", logit, i);
  }
  const auto best = std::max_element(logits.begin(), logits.end());  // the first of equal maxima
  TESSERA_CHECK(std::isfinite(*best), "sample_token: all {} logits are -inf: no token can be chosen", vocab_size);
  if (temperature == 0.0) return best - logits.begin();

  // The k largest logits, largest first; equal logits in index order.
  const int64_t k = top_k == 0 ? vocab_size : top_k;
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
    weights[j] = std::isinf(logit) ? 0.0 : std::exp((logit - *best) / temperature);
    total += weights[j];
  }
  // Inverse CDF; rounding can leave the target at the very end, where the
  // last candidate with any weight is the answer.
  const double target = uniform_double(key, draw) * total;
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

std::vector<uint16_t> generate_tokens(tessera::nn::CausalLM& model, std::vector<uint16_t> prompt,
                                      int64_t max_new_tokens, const SamplingOptions& options) {
  const int64_t vocab_size = model.vocab_size();
  TESSERA_CHECK(vocab_size <= int64_t{std::numeric_limits<uint16_t>::max()} + 1,
                "generate_tokens: tokens are uint16, but the model's vocab_size is {}", vocab_size);
  check_sampling_options(options.temperature, options.top_k, vocab_size, "generate_tokens");
  TESSERA_CHECK(max_new_tokens >= 0, "generate_tokens: max_new_tokens must be >= 0, got {}", max_new_tokens);
  TESSERA_CHECK(!prompt.empty(), "generate_tokens: the prompt is empty (the model needs at least one token)");
  for (size_t i = 0; i < prompt.size(); ++i) {
    TESSERA_CHECK(prompt[i] < vocab_size,
                  "generate_tokens: prompt token {} at position {} is outside the model's vocabulary [0, {})",
                  prompt[i], i, vocab_size);
  }

  tessera::autograd::NoGradGuard no_grad;
  TrainingModeGuard restore_mode(model);
  model.eval();
  // The tokens go where the model's parameters are.
  const std::vector<std::shared_ptr<tessera::nn::Parameter>> parameters = model.parameters();
  const tessera::Device device = parameters.empty() ? tessera::kCPU : parameters.front()->tensor().device();
  std::vector<uint16_t> tokens = std::move(prompt);
  tokens.reserve(tokens.size() + static_cast<size_t>(max_new_tokens));
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    // The context window: the last block_size tokens (positions beyond it
    // have no position embedding, or no rotary angles).
    const int64_t context = std::min(static_cast<int64_t>(tokens.size()), model.block_size());
    const std::vector<int64_t> window(tokens.end() - context, tokens.end());
    const tessera::Tensor idx = tessera::ops::to(tessera::ops::from_vector(window, {1, context}), device);
    const tessera::Tensor logits = model(idx);                                                              // [1, T, V]
    const tessera::Tensor last = tessera::ops::select(tessera::ops::select(logits, 0, 0), 0, context - 1);  // [V]
    const int64_t token = sample_token(last, options.temperature, options.top_k, options.key, static_cast<uint64_t>(i));
    tokens.push_back(static_cast<uint16_t>(token));
  }
  return tokens;
}

}  // namespace gpt
