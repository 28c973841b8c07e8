// `generate`: samples text from a trained GPT or Llama, byte-level (one token per
// byte). The model comes from a checkpoint that `train` saved (--ckpt: one
// checkpoint, or a root of step-N checkpoints, then the newest; saved on any
// number of ranks, it loads whole here) or from an exported .safetensors file
// (--init-from). Prints the prompt and its continuation to stdout (bytes that
// are not printable escaped as \xHH) and where the model came from and the
// speed to stderr. --max-new-tokens is refused, before the model loads, when
// its buffers would not fit in half the available memory (resource_limits.h).
// Flags: generate --help.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <iostream>
#include <optional>

#include "examples/gpt/byte_text.h"
#include "examples/gpt/model_loader.h"
#include "examples/gpt/resource_limits.h"
#include "examples/gpt/sampling.h"
#include "tensor/error.h"
#include "tensor/parallel.h"

namespace {

struct GenerateConfig {
  std::string checkpoint;   // --ckpt
  std::string safetensors;  // --init-from
  std::string prompt = "\n";
  int64_t max_new_tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  bool top_k_given = false;
  uint64_t seed = 1337;
  int threads = 0;  // 0: tessera's default (every core)
  std::string device = "cpu";
};

// A number flag that must be finite and >= 0 (CLI11's own range checks print
// the whole double range in their message, and its parser takes inf and nan).
const CLI::Validator kNonNegative(
    [](std::string& input) -> std::string {
      double value = 0.0;
      if (!CLI::detail::lexical_cast(input, value)) return fmt::format("'{}' is not a number", input);
      if (!std::isfinite(value)) return fmt::format("must be a finite number >= 0, got {}", input);
      if (value >= 0.0) return {};
      return fmt::format("must be >= 0, got {}", input);
    },
    ">= 0");

// Returns the exit code when the program should stop (help, or a bad flag).
std::optional<int> parse_command_line(int argc, char** argv, GenerateConfig& config) {
  CLI::App app{"Samples byte-level text from a GPT or Llama trained by `train`", "generate"};
  app.option_defaults()->always_capture_default();
  auto* checkpoint_flag = app.add_option("--ckpt", config.checkpoint,
                                         "A checkpoint directory, or a directory of step-N checkpoints (the newest "
                                         "is used)");
  auto* safetensors_flag =
      app.add_option("--init-from", config.safetensors, "An exported model (.safetensors with tessera.gpt_config)");
  checkpoint_flag->excludes(safetensors_flag);
  app.add_option("--prompt", config.prompt, "Text to continue (its bytes are the tokens)")->default_str("\\n");
  app.add_option("--max-new-tokens", config.max_new_tokens, "Tokens to sample")->check(kNonNegative);
  app.add_option("--temperature", config.temperature, "Softmax temperature (0 = greedy)")->check(kNonNegative);
  auto* top_k_flag = app.add_option("--top-k", config.top_k, "Sample among the K most likely tokens (0 = all)")
                         ->check(kNonNegative)
                         ->default_str("40, at most the vocabulary");
  app.add_option("--seed", config.seed, "Seed of the sampling draws");
  app.add_option("--threads", config.threads, "CPU threads (0 = all cores; 1 is fastest for tiny models)")
      ->check(kNonNegative);
  app.add_option("--device", config.device, "Where the model runs: cpu, or cuda (the SIMT simulator or the GPU, as built)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  try {
    app.parse(argc, argv);
    if (checkpoint_flag->count() + safetensors_flag->count() == 0) {
      throw CLI::RequiredError("--ckpt or --init-from (where the model comes from)");
    }
  } catch (const CLI::ParseError& error) {
    return app.exit(error, std::cout, std::cerr);
  }
  config.top_k_given = top_k_flag->count() > 0;
  return std::nullopt;
}

int run(const GenerateConfig& config) {
  // Before the model is loaded: a length whose buffers cannot fit is refused at once.
  const std::vector<uint16_t> prompt = gpt::text_to_byte_tokens(config.prompt);
  gpt::check_generation_length(static_cast<int64_t>(prompt.size()), config.max_new_tokens, gpt::machine_resources());
  if (config.threads > 0) tessera::set_num_threads(config.threads);
  const tessera::Device device = tessera::Device::parse(config.device);
  const std::string device_description = tessera::describe_device(device);  // a build without cuda refuses here
  const gpt::LoadedModel loaded = config.checkpoint.empty() ? gpt::load_model_from_safetensors(config.safetensors)
                                                            : gpt::load_model_from_checkpoint(config.checkpoint);
  loaded.model->to(device);
  const int64_t vocab_size = loaded.model->vocab_size();
  TESSERA_CHECK(vocab_size <= gpt::kByteVocab,
                "{}: the model's vocab_size is {}, but generate encodes text as bytes (vocab <= {}); a model of "
                "other tokens needs their tokenizer",
                loaded.source, vocab_size, gpt::kByteVocab);

  gpt::SamplingOptions options;
  options.temperature = config.temperature;
  options.top_k = config.top_k_given ? config.top_k : std::min(config.top_k, vocab_size);
  options.key = tessera::PhiloxKey{config.seed, 0};

  const auto start = std::chrono::steady_clock::now();
  const std::vector<uint16_t> tokens =
      gpt::generate_tokens(*loaded.model, prompt, config.max_new_tokens, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::cout << gpt::byte_tokens_to_printable(tokens) << '\n' << std::flush;
  const std::string step = loaded.step ? fmt::format("step {}", *loaded.step) : "step unknown";
  std::cerr << fmt::format("generate: {} ({}, {:.3f} M parameters) on {}: {} tokens in {:.2f} s, {:.1f} tokens/s\n",
                           loaded.source, step, static_cast<double>(gpt::num_parameters(loaded.config)) / 1e6,
                           device_description, config.max_new_tokens, seconds,
                           seconds > 0.0 ? static_cast<double>(config.max_new_tokens) / seconds : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  GenerateConfig config;
  if (auto exit_code = parse_command_line(argc, argv, config)) return *exit_code;
  try {
    return run(config);
  } catch (const std::exception& error) {
    std::cerr << "generate: error: " << error.what() << '\n';
    return 1;
  }
}
