// `generate`: samples text from a trained GPT or Llama, byte-level (one token
// per byte), or through the BPE tokenizer it was trained with (--tokenizer:
// the prompt encoded, the tokens decoded back to bytes). The model comes from
// a checkpoint that `train` saved (--ckpt: one checkpoint, or a root of
// step-N checkpoints, then the newest; saved on any number of ranks, it loads
// whole here) or from an exported .safetensors file (--init-from). Writes the
// prompt and its continuation to stdout: the bytes unchanged when stdout is
// not a terminal (a file or a pipe gets exactly the model's bytes), escaped
// when it is one or with --escape (a backslash as \\, bytes that are not
// printable as \xHH: byte_text.h, reversible). Where the model came from and
// the speed go to stderr. --max-new-tokens is refused, before the model
// loads, when its buffers would not fit in half the available memory
// (resource_limits.h). Exit status: 0 generated, 1 failed (a model that
// cannot be loaded, say), 2 bad flags. Flags: generate --help.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <iostream>
#include <limits>
#include <optional>

#include <unistd.h>

#include "checkpoint/file_io.h"
#include "checkpoint/file_roles.h"
#include "examples/gpt/byte_text.h"
#include "examples/gpt/flag_checks.h"
#include "examples/gpt/model_loader.h"
#include "examples/gpt/resource_limits.h"
#include "examples/gpt/sampling.h"
#include "examples/gpt/token_cache.h"
#include "examples/gpt/tokenizer/tokenizer.h"
#include "tensor/error.h"
#include "tensor/parallel.h"

namespace {

struct GenerateConfig {
  std::string checkpoint;   // --ckpt
  std::string safetensors;  // --init-from
  std::string prompt = "\n";
  std::string prompt_file;  // --prompt-file: the prompt's bytes from a file (any bytes, NUL included)
  std::string tokenizer;    // --tokenizer: "" = one token per byte
  bool escape = false;      // --escape: escaped output even when stdout is not a terminal
  int64_t max_new_tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  bool top_k_given = false;
  uint64_t seed = 1337;
  int threads = 0;  // 0: tessera's default (every core)
  std::string device = "cpu";
};

// The ranges of the number flags (flag_checks.h).
constexpr int64_t kMaxNewTokens = int64_t{1} << 40;  // memory bounds it further (check_generation_length)
constexpr double kMaxTemperature = 100.0;
constexpr int64_t kMaxTopK = 65536;
constexpr int64_t kMaxThreads = 4096;

// Returns the exit code when the program should stop (help, or a bad flag).
std::optional<int> parse_command_line(int argc, char** argv, GenerateConfig& config) {
  CLI::App app{"Samples text from a GPT or Llama trained by `train` (bytes, or through --tokenizer)", "generate"};
  app.option_defaults()->always_capture_default();
  auto* checkpoint_flag = app.add_option("--ckpt", config.checkpoint,
                                         "A checkpoint directory, or a directory of step-N checkpoints (the newest "
                                         "is used)");
  auto* safetensors_flag =
      app.add_option("--init-from", config.safetensors, "An exported model (.safetensors with tessera.gpt_config), or a Hugging Face GPT-2 or Llama directory");
  checkpoint_flag->excludes(safetensors_flag)->check(gpt::non_empty_path());
  safetensors_flag->check(gpt::non_empty_path());
  auto* prompt_flag =
      app.add_option("--prompt", config.prompt, "Text to continue (its bytes are the tokens)")->default_str("\\n");
  app.add_option("--prompt-file", config.prompt_file, "Continue the bytes of this file (any bytes, NUL included)")
      ->excludes(prompt_flag)
      ->check(gpt::non_empty_path());
  app.add_option("--tokenizer", config.tokenizer,
                 "The BPE tokenizer the model was trained with (train --tokenizer): encodes the prompt, decodes the "
                 "output")
      ->check(gpt::non_empty_path())
      ->default_str("bytes");
  app.add_flag("--escape", config.escape,
               "Escape the output (\\\\ and \\xHH) even when stdout is not a terminal; on a terminal it always is");
  app.add_option("--max-new-tokens", config.max_new_tokens, "Tokens to sample")
      ->check(gpt::integer_in(0, kMaxNewTokens));
  app.add_option("--temperature", config.temperature, "Softmax temperature (0 = greedy)")
      ->check(gpt::number_in(0.0, kMaxTemperature));
  auto* top_k_flag = app.add_option("--top-k", config.top_k, "Sample among the K most likely tokens (0 = all)")
                         ->check(gpt::integer_in(0, kMaxTopK))
                         ->default_str("40, at most the vocabulary");
  app.add_option("--seed", config.seed, "Seed of the sampling draws")->check(gpt::any_uint64());
  app.add_option("--threads", config.threads, "CPU threads (0 = all cores; 1 is fastest for tiny models)")
      ->check(gpt::integer_in(0, kMaxThreads));
  app.add_option("--device", config.device, "Where the model runs: cpu, or cuda (the SIMT simulator or the GPU, as built)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  try {
    app.parse(argc, argv);
    if (checkpoint_flag->count() + safetensors_flag->count() == 0) {
      throw CLI::RequiredError("--ckpt or --init-from (where the model comes from)");
    }
  } catch (const CLI::ParseError& error) {
    return gpt::exit_after_parse_error(app, error, std::cout, std::cerr);
  }
  config.top_k_given = top_k_flag->count() > 0;
  return std::nullopt;
}

// What generate reads must not be where its output goes (`generate --init-from
// m.safetensors >> m.safetensors`).
void check_files(const GenerateConfig& config) {
  tessera::checkpoint::FileRoles roles;
  if (!config.checkpoint.empty()) roles.add_input("--ckpt", config.checkpoint);
  if (!config.safetensors.empty()) roles.add_input("--init-from", config.safetensors);
  if (!config.prompt_file.empty()) roles.add_input("--prompt-file", config.prompt_file);
  if (!config.tokenizer.empty()) roles.add_input("--tokenizer", config.tokenizer);
  roles.add_output_stream("standard output", STDOUT_FILENO);
  roles.check();
}

// The prompt's tokens: its bytes, or its BPE ids.
std::vector<uint16_t> prompt_tokens(const std::string& text, std::optional<gpt::Tokenizer>& tokenizer) {
  if (!tokenizer) return gpt::text_to_byte_tokens(text);
  gpt::checked_token_vocab(*tokenizer);
  const std::vector<uint32_t> ids = tokenizer->encode(text);
  return std::vector<uint16_t>(ids.begin(), ids.end());  // every id < vocab_size() <= 65536
}

// The prompt's tokens, once the files and the length are proven usable
// (before the model is loaded: a length whose buffers cannot fit is refused
// at once). A refusal is a usage error.
std::vector<uint16_t> checked_prompt(const GenerateConfig& config, std::optional<gpt::Tokenizer>& tokenizer) {
  try {
    check_files(config);
    if (!config.tokenizer.empty()) tokenizer.emplace(gpt::Tokenizer::load(config.tokenizer));
    const std::vector<uint16_t> prompt = prompt_tokens(
        config.prompt_file.empty() ? config.prompt : tessera::checkpoint::read_file_text(config.prompt_file),
        tokenizer);
    gpt::check_generation_length(static_cast<int64_t>(prompt.size()), config.max_new_tokens,
                                 gpt::machine_resources());
    return prompt;
  } catch (const tessera::Error& error) {
    throw gpt::UsageError(error.what());
  }
}

// The bytes the tokens stand for.
std::string output_bytes(const std::vector<uint16_t>& tokens, const std::optional<gpt::Tokenizer>& tokenizer) {
  if (!tokenizer) return gpt::byte_tokens_to_bytes(tokens);
  return tokenizer->decode(std::vector<uint32_t>(tokens.begin(), tokens.end()));
}

int run(const GenerateConfig& config) {
  std::optional<gpt::Tokenizer> tokenizer;
  const std::vector<uint16_t> prompt = checked_prompt(config, tokenizer);
  if (config.threads > 0) tessera::set_num_threads(config.threads);
  const tessera::Device device = tessera::Device::parse(config.device);
  const std::string device_description = tessera::describe_device(device);  // a build without cuda refuses here
  const gpt::LoadedModel loaded = config.checkpoint.empty() ? gpt::load_model_from_export(config.safetensors)
                                                            : gpt::load_model_from_checkpoint(config.checkpoint);
  loaded.model->to(device);
  const int64_t vocab_size = loaded.model->vocab_size();
  if (tokenizer) {
    TESSERA_CHECK(vocab_size == tokenizer->vocab_size(),
                  "{}: the model's vocab_size is {}, but --tokenizer {} has {} ids; pass the tokenizer the model was "
                  "trained with",
                  loaded.source, vocab_size, config.tokenizer, tokenizer->vocab_size());
  } else {
    TESSERA_CHECK(vocab_size <= gpt::kByteVocab,
                  "{}: the model's vocab_size is {}, but generate encodes text as bytes (vocab <= {}); a model of "
                  "other tokens needs their tokenizer (--tokenizer)",
                  loaded.source, vocab_size, gpt::kByteVocab);
  }

  gpt::SamplingOptions options;
  options.temperature = config.temperature;
  options.top_k = config.top_k_given ? config.top_k : std::min(config.top_k, vocab_size);
  options.key = tessera::PhiloxKey{config.seed, 0};

  const auto start = std::chrono::steady_clock::now();
  const std::vector<uint16_t> tokens =
      gpt::generate_tokens(*loaded.model, prompt, config.max_new_tokens, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const std::string bytes = output_bytes(tokens, tokenizer);
  if (config.escape || ::isatty(STDOUT_FILENO) == 1) {
    std::cout << gpt::bytes_to_printable(bytes) << '\n';
  } else {
    std::cout << bytes;
  }
  std::cout << std::flush;
  TESSERA_CHECK(std::cout.good(), "writing the text to standard output failed");
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
  } catch (const gpt::UsageError& error) {
    std::cerr << "generate: error: " << error.what() << "\nRun with --help for more information.\n";
    return gpt::kUsageExitCode;
  } catch (const std::exception& error) {
    std::cerr << "generate: error: " << error.what() << '\n';
    return 1;
  }
}
