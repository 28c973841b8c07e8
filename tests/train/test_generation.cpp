// tessera::train::generate with and without the KV cache: the same tokens for a GPT and
// a Llama (GQA), greedy and sampled (top-k, top-p), for prompts shorter and
// longer than block_size and continuations past it (the cache refilled from
// the windows); a left-padded batch continues each prompt as it is continued
// alone (with its own stream of draws); a stop token ends its sequence, kept
// as its last token, while the others go on unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "tensor/error.h"
#include "train/byte_text.h"
#include "train/generation.h"

using tessera::PhiloxKey;

namespace {

// The small models here have block_size 12: the longer prompts and
// continuations below cross it.
constexpr int64_t kBlockSize = 12;

std::unique_ptr<tessera::nn::CausalLM> small_gpt() {
  tessera::nn::GPTConfig config = tessera::nn::GPTConfig::preset("nano");
  config.block_size = kBlockSize;
  config.dropout = 0.5;  // would change every step if generation ran in train mode
  auto model = std::make_unique<tessera::nn::GPT>(config, tessera::kMeta);
  model->to_empty(tessera::kCPU);
  model->reset_parameters(21);
  return model;
}

std::unique_ptr<tessera::nn::CausalLM> small_llama() {
  tessera::nn::LlamaConfig config = tessera::nn::LlamaConfig::preset("llama-nano");  // 2 heads, 1 kv head
  config.block_size = kBlockSize;
  auto model = std::make_unique<tessera::nn::Llama>(config, tessera::kMeta);
  model->to_empty(tessera::kCPU);
  model->reset_parameters(22);
  return model;
}

std::vector<std::vector<uint32_t>> prompts_of(const std::vector<std::string>& texts) {
  std::vector<std::vector<uint32_t>> prompts;
  for (const std::string& text : texts) prompts.push_back(tessera::train::text_to_byte_tokens(text));
  return prompts;
}

// Shorter than block_size, one token, and longer than it.
const std::vector<std::string> kTexts = {"Hello", "a", "The quick brown fox"};

const tessera::train::SamplingOptions kGreedy{.temperature = 0.0, .top_k = 0, .key = PhiloxKey{}};
const tessera::train::SamplingOptions kSampled{.temperature = 1.0, .top_k = 0, .top_p = 0.9, .key = PhiloxKey{77, 3}};

std::vector<std::vector<uint32_t>> tokens_of(const std::vector<tessera::train::GeneratedSequence>& sequences) {
  std::vector<std::vector<uint32_t>> tokens;
  for (const tessera::train::GeneratedSequence& sequence : sequences) tokens.push_back(sequence.tokens);
  return tokens;
}

}  // namespace

TEST_CASE("generate: the KV cache gives the cacheless tokens, for a GPT and a Llama, past block_size too") {
  for (auto* make : {&small_gpt, &small_llama}) {
    auto model = make();
    for (const tessera::train::SamplingOptions& sampling : {kGreedy, kSampled}) {
      INFO(model->type_name() << ", temperature " << sampling.temperature);
      tessera::train::GenerationOptions options{.max_new_tokens = 25, .sampling = sampling};
      const std::vector<tessera::train::GeneratedSequence> cached = tessera::train::generate(*model, prompts_of(kTexts), options);
      options.kv_cache = false;
      const std::vector<tessera::train::GeneratedSequence> uncached = tessera::train::generate(*model, prompts_of(kTexts), options);
      REQUIRE(cached.size() == 3);
      CHECK(tokens_of(cached) == tokens_of(uncached));
      for (size_t b = 0; b < cached.size(); ++b) {
        CHECK(cached[b].prompt_length == static_cast<int64_t>(kTexts[b].size()));
        CHECK(cached[b].tokens.size() == kTexts[b].size() + 25);
        CHECK_FALSE(cached[b].stopped);
      }
      CHECK(model->is_training());  // the mode is restored
    }
  }
}

TEST_CASE("generate: a batch continues each prompt as it is continued alone, with its own stream") {
  auto model = small_llama();
  const tessera::train::GenerationOptions options{.max_new_tokens = 15, .sampling = kSampled};
  const std::vector<tessera::train::GeneratedSequence> batch = tessera::train::generate(*model, prompts_of(kTexts), options);
  for (size_t b = 0; b < kTexts.size(); ++b) {
    CAPTURE(b);
    tessera::train::GenerationOptions alone = options;
    alone.sampling.key.stream += b;
    CHECK(tessera::train::generate(*model, prompts_of({kTexts[b]}), alone).front().tokens == batch[b].tokens);
  }
  // Equal prompts draw from different streams, so they part ways.
  const std::vector<tessera::train::GeneratedSequence> twins = tessera::train::generate(*model, prompts_of({"ab", "ab"}), options);
  CHECK(twins[0].tokens != twins[1].tokens);
  // The same seed gives the same text; another seed another.
  CHECK(tokens_of(tessera::train::generate(*model, prompts_of(kTexts), options)) == tokens_of(batch));
  tessera::train::GenerationOptions reseeded = options;
  reseeded.sampling.key.seed += 1;
  CHECK(tokens_of(tessera::train::generate(*model, prompts_of(kTexts), reseeded)) != tokens_of(batch));
}

TEST_CASE("generate: a stop token ends its sequence (kept as the last token); the others go on unchanged") {
  for (auto* make : {&small_gpt, &small_llama}) {
    auto model = make();
    for (const bool kv_cache : {true, false}) {
      INFO(model->type_name() << (kv_cache ? ", KV cache" : ", no KV cache"));
      tessera::train::GenerationOptions options{.max_new_tokens = 20, .sampling = kSampled, .kv_cache = kv_cache};
      const std::vector<tessera::train::GeneratedSequence> free_running = tessera::train::generate(*model, prompts_of(kTexts), options);
      // The stop: the fourth new token of the first sequence.
      const uint32_t stop = free_running[0].tokens[static_cast<size_t>(free_running[0].prompt_length) + 3];
      options.stop_tokens = {stop};
      const std::vector<tessera::train::GeneratedSequence> stopped = tessera::train::generate(*model, prompts_of(kTexts), options);
      for (size_t b = 0; b < kTexts.size(); ++b) {
        CAPTURE(b);
        const std::vector<uint32_t>& full = free_running[b].tokens;
        const auto first_new = full.begin() + free_running[b].prompt_length;
        const auto at = std::find(first_new, full.end(), stop);
        const std::vector<uint32_t> expected(full.begin(), at == full.end() ? full.end() : at + 1);
        CHECK(stopped[b].tokens == expected);
        CHECK(stopped[b].stopped == (at != full.end()));
      }
      CHECK(stopped[0].stopped);
      CHECK(stopped[0].tokens.size() <= static_cast<size_t>(stopped[0].prompt_length) + 4);
    }
  }
}

TEST_CASE("generate: no new tokens gives the prompts back without running the model") {
  auto model = small_gpt();
  const std::vector<tessera::train::GeneratedSequence> none = tessera::train::generate(*model, prompts_of(kTexts), {.max_new_tokens = 0});
  CHECK(tokens_of(none) == prompts_of(kTexts));
  // A stop token that is already in the prompt changes nothing: only new tokens stop.
  const std::vector<uint32_t> hello = tessera::train::text_to_byte_tokens("Hello");
  const std::vector<tessera::train::GeneratedSequence> one =
      tessera::train::generate(*model, {hello}, {.max_new_tokens = 1, .sampling = kGreedy, .stop_tokens = {'H', 'e'}});
  CHECK(one[0].tokens.size() == 6);
}
