// bench/generate_speed: greedy generation speed of GPT-2 124M on the CPU, in
// new tokens per second, with the KV cache and without it (every step runs
// the whole context again: what `generate` did before the cache), at each
// --threads. The weights are a random init, or with --init-from DIR a
// Hugging Face directory: the one bench/generate_speed_torch.py --save DIR
// wrote, so that transformers' GPT2LMHeadModel.generate and tessera run the
// same weights on the same prompt, (i * 7919 + 13) mod 50257 for i below
// --prompt-tokens. Times are wall time (the threads run in parallel), one
// run each after a short warm-up; the machine's other load counts, so read
// ratios within one run. Each run's tokens are checked equal between the two
// modes, and their FNV-1a digest is printed as the Python script prints
// transformers' (greedy tokens from f32 logits can part where two are
// nearly tied; the golden tests pin equality on chosen models).
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <chrono>
#include <vector>

#include "bench/machine_context.h"
#include "nn/models/gpt.h"
#include "tensor/gemm_backend.h"
#include "tensor/parallel.h"
#include "train/generation.h"
#include "train/model_loader.h"

namespace {

struct Run {
  double seconds = 0.0;
  std::vector<uint32_t> tokens;
};

Run time_generation(tessera::nn::CausalLM& model, const std::vector<uint32_t>& prompt, int64_t new_tokens,
                    bool kv_cache) {
  const tessera::train::GenerationOptions options{.max_new_tokens = new_tokens,
                                       .sampling = {.temperature = 0.0, .top_k = 0},
                                       .kv_cache = kv_cache};
  const auto start = std::chrono::steady_clock::now();
  std::vector<tessera::train::GeneratedSequence> sequences = tessera::train::generate(model, {prompt}, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {seconds, std::move(sequences.front().tokens)};
}

// FNV-1a over the ids as 64-bit integers: the digest bench/generate_speed_torch.py computes.
uint64_t token_digest(const std::vector<uint32_t>& tokens) {
  uint64_t hash = 14695981039346656037ull;
  for (const uint32_t token : tokens) {
    hash ^= token;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Greedy generation speed of GPT-2 124M on the CPU, with and without the KV cache", "generate_speed"};
  int64_t prompt_tokens = 64;
  int64_t new_tokens = 256;
  std::vector<int> threads = {1, 2};
  bool skip_no_cache = false;
  std::string init_from;
  app.add_option("--prompt-tokens", prompt_tokens, "Prompt length")->check(CLI::Range(1, 512));
  app.add_option("--new-tokens", new_tokens, "Tokens to generate")->check(CLI::Range(1, 512));
  app.add_option("--threads", threads, "Thread counts to run at")->check(CLI::Range(1, 1024));
  app.add_flag("--skip-no-cache", skip_no_cache, "Time only the cached generation (the cacheless one takes minutes)");
  app.add_option("--init-from", init_from,
                 "A Hugging Face GPT-2 directory (bench/generate_speed_torch.py --save DIR) instead of a random init");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<tessera::nn::CausalLM> model;
  std::string weights = "random init";
  if (init_from.empty()) {
    auto random = std::make_unique<tessera::nn::GPT>(tessera::nn::GPTConfig::preset("gpt2-124m"), tessera::kMeta);
    random->to_empty(tessera::kCPU);
    random->reset_parameters(1234);
    model = std::move(random);
  } else {
    model = tessera::train::load_model_from_hf_dir(init_from).model;
    weights = init_from;
  }
  std::vector<uint32_t> prompt;
  for (int64_t i = 0; i < prompt_tokens; ++i) prompt.push_back(static_cast<uint32_t>((i * 7919 + 13) % 50257));

  fmt::print("generate_speed: GPT-2 124M ({}, f32), greedy, prompt {} tokens, {} new tokens\n", weights,
             prompt_tokens, new_tokens);
  fmt::print("machine: {}, {}, GEMM {}, load average {}\n", bench::cpu_model(), bench::vector_isa(),
             tessera::gemm_description(), bench::load_average());
  for (const int count : threads) {
    tessera::set_num_threads(count);
    time_generation(*model, prompt, 8, true);  // warm-up: page in the weights, size the allocator's pools
    const Run cached = time_generation(*model, prompt, new_tokens, true);
    fmt::print("threads {}: KV cache     {:8.2f} tokens/s ({:.2f} s), token digest {:016x}\n", count,
               static_cast<double>(new_tokens) / cached.seconds, cached.seconds, token_digest(cached.tokens));
    if (skip_no_cache) continue;
    const Run uncached = time_generation(*model, prompt, new_tokens, false);
    fmt::print("threads {}: no KV cache  {:8.2f} tokens/s ({:.2f} s); the cache is {:.1f}x faster, {} tokens\n", count,
               static_cast<double>(new_tokens) / uncached.seconds, uncached.seconds,
               uncached.seconds / cached.seconds, cached.tokens == uncached.tokens ? "the same" : "DIFFERENT");
  }
  fmt::print("load average after: {}\n", bench::load_average());
  return 0;
}
