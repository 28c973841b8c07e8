// The generation loop: checks, the cached batch (prefill, one token a step,
// a refill past block_size) and the cacheless reference.
#include "train/generation.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tessera::train {

namespace {

using tessera::Tensor;
using tessera::nn::CausalLM;

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

void check_inputs(const CausalLM& model, const std::vector<std::vector<uint32_t>>& prompts,
                  const GenerationOptions& options) {
  const int64_t vocab_size = model.vocab_size();
  check_sampling_options(options.sampling, vocab_size, "generate");
  TESSERA_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}", options.max_new_tokens);
  TESSERA_CHECK(!prompts.empty(), "generate: no prompts (a batch needs at least one)");
  for (size_t b = 0; b < prompts.size(); ++b) {
    TESSERA_CHECK(!prompts[b].empty(), "generate: prompt {} is empty (the model needs at least one token)", b);
    for (size_t i = 0; i < prompts[b].size(); ++i) {
      TESSERA_CHECK(prompts[b][i] < vocab_size,
                    "generate: prompt {}: token {} at position {} is outside the model's vocabulary [0, {})", b,
                    prompts[b][i], i, vocab_size);
    }
  }
  for (const uint32_t token : options.stop_tokens) {
    TESSERA_CHECK(token < vocab_size, "generate: stop token {} is outside the model's vocabulary [0, {})", token,
                  vocab_size);
  }
}

tessera::Device device_of(const CausalLM& model) {
  const auto parameters = model.parameters();
  return parameters.empty() ? tessera::kCPU : parameters.front()->tensor().device();
}

// The last block_size tokens: what the model may see.
std::vector<uint32_t> window_of(const std::vector<uint32_t>& tokens, int64_t block_size) {
  const auto length = static_cast<int64_t>(tokens.size());
  return {tokens.end() - std::min(length, block_size), tokens.end()};
}

// Samples sequence b's next token from its logits row [V] and appends it; a
// stop token or the last allowed token ends the sequence. Returns whether it did.
bool append_sampled(GeneratedSequence& sequence, int64_t b, const Tensor& logits_row,
                    const GenerationOptions& options) {
  SamplingOptions sampling = options.sampling;
  sampling.key.stream += static_cast<uint64_t>(b);
  const auto generated = static_cast<int64_t>(sequence.tokens.size()) - sequence.prompt_length;
  const auto token = static_cast<uint32_t>(sample_token(logits_row, sampling, static_cast<uint64_t>(generated)));
  sequence.tokens.push_back(token);
  sequence.stopped =
      std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end();
  return sequence.stopped || generated + 1 == options.max_new_tokens;
}

// Every sequence alone, the whole window through forward at each step.
void generate_without_cache(CausalLM& model, std::vector<GeneratedSequence>& sequences,
                            const GenerationOptions& options, tessera::Device device) {
  for (size_t b = 0; b < sequences.size(); ++b) {
    bool done = false;
    while (!done) {
      const std::vector<uint32_t> window = window_of(sequences[b].tokens, model.block_size());
      const auto T = static_cast<int64_t>(window.size());
      const std::vector<int64_t> context(window.begin(), window.end());
      const Tensor idx = tessera::ops::to(tessera::ops::from_vector(context, {1, T}), device);
      const Tensor logits = model(idx);  // [1, T, V]
      const Tensor last = tessera::ops::select(tessera::ops::select(logits, 0, 0), 0, T - 1);
      done = append_sampled(sequences[b], static_cast<int64_t>(b), tessera::ops::to(last, tessera::kCPU), options);
    }
  }
}

// Resets `cache` for the sequences' windows, left-padded to the longest, and
// runs them through the model: the last position's logits [B, 1, V] on the CPU.
Tensor prefill(CausalLM& model, tessera::nn::KVCache& cache, const std::vector<GeneratedSequence>& sequences,
               tessera::Device device) {
  std::vector<std::vector<uint32_t>> windows;
  int64_t longest = 0;
  for (const GeneratedSequence& sequence : sequences) {
    windows.push_back(window_of(sequence.tokens, model.block_size()));
    longest = std::max(longest, static_cast<int64_t>(windows.back().size()));
  }
  const auto B = static_cast<int64_t>(sequences.size());
  std::vector<int64_t> idx(static_cast<size_t>(B * longest), 0);  // padding: token 0, masked out
  std::vector<int64_t> padding;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<uint32_t>& window = windows[static_cast<size_t>(b)];
    padding.push_back(longest - static_cast<int64_t>(window.size()));
    std::copy(window.begin(), window.end(), idx.begin() + b * longest + padding.back());
  }
  cache.reset(std::move(padding));
  const Tensor input = tessera::ops::to(tessera::ops::from_vector(idx, {B, longest}), device);
  return tessera::ops::to(model.forward_cached(input, cache, CausalLM::CachedLogits::last), tessera::kCPU);
}

// One batch with a KV cache: a prefill, then one token per sequence a step
// (a finished sequence is fed its last token again, its logits unused).
void generate_with_cache(CausalLM& model, std::vector<GeneratedSequence>& sequences, const GenerationOptions& options,
                         tessera::Device device) {
  const auto B = static_cast<int64_t>(sequences.size());
  int64_t longest = 0;
  for (const GeneratedSequence& sequence : sequences) {
    longest = std::max(longest, std::min(static_cast<int64_t>(sequence.tokens.size()), model.block_size()));
  }
  // The slots the steps fill: the longest window, then a token for every new
  // token but the last, up to block_size (then refills take over).
  const int64_t capacity = std::min(model.block_size(), longest + options.max_new_tokens - 1);
  tessera::nn::KVCache cache = model.make_kv_cache(B, capacity);
  Tensor logits = prefill(model, cache, sequences, device);  // [B, 1, V]
  std::vector<bool> done(static_cast<size_t>(B), false);
  while (true) {
    for (int64_t b = 0; b < B; ++b) {
      if (done[static_cast<size_t>(b)]) continue;
      done[static_cast<size_t>(b)] = append_sampled(sequences[static_cast<size_t>(b)], b,
                                                    tessera::ops::select(tessera::ops::select(logits, 0, b), 0, 0),
                                                    options);
    }
    if (std::all_of(done.begin(), done.end(), [](bool finished) { return finished; })) return;
    if (!cache.fits(1, model.block_size())) {
      logits = prefill(model, cache, sequences, device);  // the windows have moved past block_size
      continue;
    }
    std::vector<int64_t> next;
    for (const GeneratedSequence& sequence : sequences) next.push_back(sequence.tokens.back());
    const Tensor idx = tessera::ops::to(tessera::ops::from_vector(next, {B, 1}), device);
    logits = tessera::ops::to(model.forward_cached(idx, cache, CausalLM::CachedLogits::last), tessera::kCPU);
  }
}

}  // namespace

std::vector<GeneratedSequence> generate(CausalLM& model, const std::vector<std::vector<uint32_t>>& prompts,
                                        const GenerationOptions& options) {
  check_inputs(model, prompts, options);
  std::vector<GeneratedSequence> sequences;
  for (const std::vector<uint32_t>& prompt : prompts) {
    sequences.push_back({.tokens = prompt, .prompt_length = static_cast<int64_t>(prompt.size())});
  }
  if (options.max_new_tokens == 0) return sequences;

  tessera::autograd::NoGradGuard no_grad;
  TrainingModeGuard restore_mode(model);
  model.eval();
  const tessera::Device device = device_of(model);  // the tokens go where the parameters are
  if (options.kv_cache) {
    generate_with_cache(model, sequences, options, device);
  } else {
    generate_without_cache(model, sequences, options, device);
  }
  return sequences;
}

}  // namespace tessera::train
