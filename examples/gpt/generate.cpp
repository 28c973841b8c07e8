// `generate`: samples text from a trained GPT or Llama, byte-level (one token
// per byte), or through the BPE tokenizer it was trained with (--tokenizer:
// the prompt encoded, the tokens decoded back to bytes). The model comes from
// a checkpoint that `train` saved (--ckpt: one checkpoint, or a root of
// step-N checkpoints, then the newest; saved on any number of ranks, it loads
// whole here) or from an exported .safetensors file (--init-from). Decodes
// with a KV cache (generation.h; --no-kv-cache runs the whole context every
// step). One prompt (--prompt, --prompt-file): writes the prompt and its
// continuation to stdout, the bytes unchanged when stdout is not a terminal
// (a file or a pipe gets exactly the model's bytes), escaped when it is one
// or with --escape (a backslash as \\, bytes that are not printable as \xHH:
// byte_text.h, reversible). A batch (--prompts-file: one escaped prompt a
// line): one escaped line per prompt, newlines as \x0a. --stop ends a
// sequence at a token (escaped text of one token, or --stop-id); without it,
// a Hugging Face directory's generation ends at its eos ids. Where the
// model came from and the speed go to stderr. --max-new-tokens is refused,
// before the model loads, when its buffers would not fit in half the
// available memory (resource_limits.h). Exit status: 0 generated, 1 failed (a model that
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
#include "tensor/error.h"
#include "tensor/parallel.h"
#include "train/byte_text.h"
#include "train/file_roles.h"
#include "train/flag_checks.h"
#include "train/generation.h"
#include "train/huggingface/hf_checkpoint.h"
#include "train/model_loader.h"
#include "train/resource_limits.h"
#include "train/tokenizer/tokenizer.h"

namespace {

struct GenerateConfig {
  std::string checkpoint;   // --ckpt
  std::string safetensors;  // --init-from
  std::string prompt = "\n";
  std::string prompt_file;   // --prompt-file: the prompt's bytes from a file (any bytes, NUL included)
  std::string prompts_file;  // --prompts-file: a batch, one escaped prompt a line
  std::string tokenizer;     // --tokenizer: "" = one token per byte
  bool escape = false;       // --escape: escaped output even when stdout is not a terminal
  int64_t max_new_tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  bool top_k_given = false;
  double top_p = 1.0;
  std::vector<std::string> stop_texts;  // --stop: escaped text of one token each
  std::vector<int64_t> stop_ids;        // --stop-id
  bool no_kv_cache = false;
  uint64_t seed = 1337;
  int threads = 0;  // 0: tessera's default (every core)
  std::string device = "cpu";
};

// The ranges of the number flags (flag_checks.h).
constexpr int64_t kMaxNewTokens = int64_t{1} << 40;  // memory bounds it further (check_generation_length)
constexpr double kMaxTemperature = 100.0;
constexpr int64_t kMaxTopK = int64_t{1} << 20;  // above any vocabulary; the model's bounds it further
constexpr int64_t kMaxTokenId = std::numeric_limits<uint32_t>::max();
constexpr int64_t kMaxThreads = 4096;

// Returns the exit code when the program should stop (help, or a bad flag).
std::optional<int> parse_command_line(int argc, char** argv, GenerateConfig& config) {
  CLI::App app{"Samples text from a GPT or Llama trained by `train` (bytes, or through --tokenizer)", "generate"};
  app.option_defaults()->always_capture_default();
  auto* checkpoint_flag = app.add_option("--ckpt", config.checkpoint,
                                         "A checkpoint directory, or a directory of step-N checkpoints (the newest "
                                         "is used)");
  auto* safetensors_flag =
      app.add_option("--init-from", config.safetensors,
                     "An exported model (.safetensors with tessera.gpt_config), or a Hugging Face GPT-2 or Llama "
                     "directory");
  checkpoint_flag->excludes(safetensors_flag)->check(tessera::train::non_empty_path());
  safetensors_flag->check(tessera::train::non_empty_path());
  auto* prompt_flag =
      app.add_option("--prompt", config.prompt, "Text to continue (its bytes are the tokens)")->default_str("\\n");
  auto* prompt_file_flag =
      app.add_option("--prompt-file", config.prompt_file, "Continue the bytes of this file (any bytes, NUL included)")
          ->excludes(prompt_flag)
          ->check(tessera::train::non_empty_path());
  app.add_option("--prompts-file", config.prompts_file,
                 "A batch: one prompt a line, escaped as the output is (\\\\ for a backslash, \\xHH for any byte); "
                 "prints one escaped line per prompt, in order")
      ->excludes(prompt_flag)
      ->excludes(prompt_file_flag)
      ->check(tessera::train::non_empty_path());
  app.add_option("--tokenizer", config.tokenizer,
                 "The BPE tokenizer the model was trained with (train --tokenizer): encodes the prompt, decodes the "
                 "output")
      ->check(tessera::train::non_empty_path())
      ->default_str("bytes");
  app.add_flag("--escape", config.escape,
               "Escape the output (\\\\ and \\xHH) even when stdout is not a terminal; on a terminal it always is");
  app.add_option("--max-new-tokens", config.max_new_tokens, "Tokens to sample (per prompt)")
      ->check(tessera::train::integer_in(0, kMaxNewTokens));
  app.add_option("--temperature", config.temperature, "Softmax temperature (0 = greedy)")
      ->check(tessera::train::number_in(0.0, kMaxTemperature));
  auto* top_k_flag = app.add_option("--top-k", config.top_k, "Sample among the K most likely tokens (0 = all)")
                         ->check(tessera::train::integer_in(0, kMaxTopK))
                         ->default_str("40, at most the vocabulary");
  app.add_option("--top-p", config.top_p,
                 "Nucleus sampling: of those, the fewest most likely tokens whose probability reaches P (1 = all)")
      ->check(tessera::train::number_in(0.0, 1.0, /*min_exclusive=*/true));
  app.add_option("--stop", config.stop_texts,
                 "End a sequence when it samples this token (kept in the output): text of exactly one token, escaped "
                 "as the output is (--stop '\\x0a' for a newline); repeatable")
      ->default_str("none; a Hugging Face directory's eos ids");
  app.add_option("--stop-id", config.stop_ids, "End a sequence at this token id (kept in the output); repeatable")
      ->check(tessera::train::integer_in(0, kMaxTokenId))
      ->default_str("none");
  app.add_flag("--no-kv-cache", config.no_kv_cache,
               "Run the whole context through the model for every token instead of caching keys and values (the "
               "reference the cache is checked against; slower)");
  app.add_option("--seed", config.seed, "Seed of the sampling draws (prompt b of a batch draws from stream b)")
      ->check(tessera::train::any_uint64());
  app.add_option("--threads", config.threads, "CPU threads (0 = all cores; 1 is fastest for tiny models)")
      ->check(tessera::train::integer_in(0, kMaxThreads));
  app.add_option("--device", config.device, "Where the model runs: cpu, or cuda (the SIMT simulator or the GPU, as built)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  try {
    app.parse(argc, argv);
    if (checkpoint_flag->count() + safetensors_flag->count() == 0) {
      throw CLI::RequiredError("--ckpt or --init-from (where the model comes from)");
    }
  } catch (const CLI::ParseError& error) {
    return tessera::train::exit_after_parse_error(app, error, std::cout, std::cerr);
  }
  config.top_k_given = top_k_flag->count() > 0;
  return std::nullopt;
}

// What generate reads must not be where its output goes (`generate --init-from
// m.safetensors >> m.safetensors`).
void check_files(const GenerateConfig& config) {
  tessera::train::FileRoles roles;
  if (!config.checkpoint.empty()) roles.add_input("--ckpt", config.checkpoint);
  if (!config.safetensors.empty()) roles.add_input("--init-from", config.safetensors);
  if (!config.prompt_file.empty()) roles.add_input("--prompt-file", config.prompt_file);
  if (!config.prompts_file.empty()) roles.add_input("--prompts-file", config.prompts_file);
  if (!config.tokenizer.empty()) roles.add_input("--tokenizer", config.tokenizer);
  roles.add_output_stream("standard output", STDOUT_FILENO);
  roles.check();
}

// The tokens of some text: its bytes, or its BPE ids.
std::vector<uint32_t> text_tokens(const std::string& text, std::optional<tessera::train::Tokenizer>& tokenizer) {
  return tokenizer ? tokenizer->encode(text) : tessera::train::text_to_byte_tokens(text);
}

// The prompts of --prompts-file: each line's bytes, unescaped (byte_text.h).
// A final newline ends the last line; an empty line is refused.
std::vector<std::string> prompts_of_file(const std::string& path) {
  const std::string text = tessera::checkpoint::read_file_text(path);
  std::vector<std::string> prompts;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    const std::string line = text.substr(begin, end - begin);
    const size_t line_number = prompts.size() + 1;
    TESSERA_CHECK(!line.empty(), "--prompts-file {}: line {} is empty (every prompt needs a token)", path,
                  line_number);
    try {
      prompts.push_back(tessera::train::printable_to_bytes(line));
    } catch (const tessera::Error& error) {
      tessera::fail("--prompts-file {}: line {}: {}", path, line_number, error.what());
    }
    begin = end + 1;
  }
  TESSERA_CHECK(!prompts.empty(), "--prompts-file {} holds no prompt", path);
  return prompts;
}

// The stop tokens: each --stop text encodes to exactly one token.
std::vector<uint32_t> stop_tokens(const GenerateConfig& config, std::optional<tessera::train::Tokenizer>& tokenizer) {
  std::vector<uint32_t> tokens(config.stop_ids.begin(), config.stop_ids.end());
  for (const std::string& escaped : config.stop_texts) {
    const std::vector<uint32_t> ids = text_tokens(tessera::train::printable_to_bytes(escaped), tokenizer);
    TESSERA_CHECK(ids.size() == 1,
                  "--stop '{}' is {} tokens {}, not one (a stop is a single token: give its text as the tokenizer "
                  "splits it, or its id with --stop-id)",
                  escaped, ids.size(), ids);
    tokens.push_back(ids.front());
  }
  return tokens;
}

// What the command line asks for, once the files and the length are proven
// usable (before the model is loaded: a length whose buffers cannot fit is
// refused at once). A refusal is a usage error.
struct GenerationRequest {
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<uint32_t> stop_tokens;
};

GenerationRequest checked_request(const GenerateConfig& config, std::optional<tessera::train::Tokenizer>& tokenizer) {
  try {
    check_files(config);
    if (!config.tokenizer.empty()) tokenizer.emplace(tessera::train::Tokenizer::load(config.tokenizer));
    std::vector<std::string> texts;
    if (!config.prompts_file.empty()) {
      texts = prompts_of_file(config.prompts_file);
    } else {
      texts.push_back(config.prompt_file.empty() ? config.prompt
                                                 : tessera::checkpoint::read_file_text(config.prompt_file));
    }
    GenerationRequest request;
    int64_t prompt_tokens = 0;
    for (const std::string& text : texts) {
      request.prompts.push_back(text_tokens(text, tokenizer));
      prompt_tokens += static_cast<int64_t>(request.prompts.back().size());
    }
    request.stop_tokens = stop_tokens(config, tokenizer);
    tessera::train::check_generation_length(prompt_tokens, config.max_new_tokens, tessera::train::machine_resources(),
                                 static_cast<int64_t>(texts.size()));
    return request;
  } catch (const tessera::Error& error) {
    throw tessera::train::UsageError(error.what());
  }
}

// The bytes the tokens stand for.
std::string output_bytes(const std::vector<uint32_t>& tokens, const std::optional<tessera::train::Tokenizer>& tokenizer) {
  if (!tokenizer) return tessera::train::byte_tokens_to_bytes(tokens);
  return tokenizer->decode(tokens);
}

// One prompt: its bytes as they are, or escaped; a batch: one escaped line per sequence.
void write_output(const std::vector<tessera::train::GeneratedSequence>& sequences, const std::optional<tessera::train::Tokenizer>& tokenizer,
                  const GenerateConfig& config) {
  const bool escaped = config.escape || ::isatty(STDOUT_FILENO) == 1;
  if (config.prompts_file.empty()) {
    const std::string bytes = output_bytes(sequences.front().tokens, tokenizer);
    std::cout << (escaped ? tessera::train::bytes_to_printable(bytes) + '\n' : bytes);
  } else {
    for (const tessera::train::GeneratedSequence& sequence : sequences) {
      std::string line = tessera::train::bytes_to_printable(output_bytes(sequence.tokens, tokenizer));
      for (size_t at = line.find('\n'); at != std::string::npos; at = line.find('\n', at)) line.replace(at, 1, "\\x0a");
      std::cout << line << '\n';
    }
  }
  std::cout << std::flush;
  TESSERA_CHECK(std::cout.good(), "writing the text to standard output failed");
}

int run(const GenerateConfig& config) {
  std::optional<tessera::train::Tokenizer> tokenizer;
  const GenerationRequest request = checked_request(config, tokenizer);
  if (config.threads > 0) tessera::set_num_threads(config.threads);
  const tessera::Device device = tessera::Device::parse(config.device);
  const std::string device_description = tessera::describe_device(device);  // a build without cuda refuses here
  const tessera::train::LoadedModel loaded = config.checkpoint.empty() ? tessera::train::load_model_from_export(config.safetensors)
                                                            : tessera::train::load_model_from_checkpoint(config.checkpoint);
  loaded.model->to(device);
  const int64_t vocab_size = loaded.model->vocab_size();
  if (tokenizer) {
    TESSERA_CHECK(vocab_size == tokenizer->vocab_size(),
                  "{}: the model's vocab_size is {}, but --tokenizer {} has {} ids; pass the tokenizer the model was "
                  "trained with",
                  loaded.source, vocab_size, config.tokenizer, tokenizer->vocab_size());
  } else {
    TESSERA_CHECK(vocab_size <= tessera::train::kByteVocab,
                  "{}: the model's vocab_size is {}, but generate encodes text as bytes (vocab <= {}); a model of "
                  "other tokens needs their tokenizer (--tokenizer)",
                  loaded.source, vocab_size, tessera::train::kByteVocab);
  }
  for (const uint32_t token : request.stop_tokens) {
    if (token >= vocab_size) {
      throw tessera::train::UsageError(fmt::format("--stop-id {}: the model's vocabulary is [0, {})", token, vocab_size));
    }
  }
  // Without --stop, a Hugging Face model ends where transformers' generate would: at its eos ids.
  std::vector<uint32_t> stop_tokens = request.stop_tokens;
  if (stop_tokens.empty() && !loaded.end_of_text_ids.empty()) {
    stop_tokens.assign(loaded.end_of_text_ids.begin(), loaded.end_of_text_ids.end());
    std::cerr << fmt::format("generate: stopping at {}'s end-of-text id{} {} (--stop or --stop-id to choose others)\n",
                             loaded.source, stop_tokens.size() == 1 ? "" : "s", fmt::join(stop_tokens, ", "));
  }

  tessera::train::GenerationOptions options;
  options.max_new_tokens = config.max_new_tokens;
  options.sampling.temperature = config.temperature;
  options.sampling.top_k = config.top_k_given ? config.top_k : std::min(config.top_k, vocab_size);
  options.sampling.top_p = config.top_p;
  options.sampling.key = tessera::PhiloxKey{config.seed, 0};
  options.stop_tokens = stop_tokens;
  options.kv_cache = !config.no_kv_cache;

  const auto start = std::chrono::steady_clock::now();
  const std::vector<tessera::train::GeneratedSequence> sequences = tessera::train::generate(*loaded.model, request.prompts, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  write_output(sequences, tokenizer, config);

  int64_t new_tokens = 0;
  for (const tessera::train::GeneratedSequence& sequence : sequences) {
    new_tokens += static_cast<int64_t>(sequence.tokens.size()) - sequence.prompt_length;
  }
  const std::string step = loaded.step ? fmt::format("step {}", *loaded.step) : "step unknown";
  const std::string batch =
      sequences.size() > 1 ? fmt::format(" for {} prompts", sequences.size()) : std::string();
  std::cerr << fmt::format(
      "generate: {} ({}, {:.3f} M parameters) on {}: {} tokens{} in {:.2f} s, {:.1f} tokens/s ({})\n", loaded.source,
      step, static_cast<double>(tessera::train::num_parameters(loaded.config)) / 1e6, device_description, new_tokens, batch,
      seconds, seconds > 0.0 ? static_cast<double>(new_tokens) / seconds : 0.0,
      options.kv_cache ? "KV cache" : "no KV cache");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  GenerateConfig config;
  if (auto exit_code = parse_command_line(argc, argv, config)) return *exit_code;
  // A Hugging Face model directory's own tokenizer, unless --tokenizer names one.
  if (config.tokenizer.empty() && !config.safetensors.empty() && tessera::train::is_hf_model_dir(config.safetensors) &&
      tessera::train::holds_tokenizer(config.safetensors)) {
    config.tokenizer = config.safetensors;
  }
  try {
    return run(config);
  } catch (const tessera::train::UsageError& error) {
    std::cerr << "generate: error: " << error.what() << "\nRun with --help for more information.\n";
    return tessera::train::kUsageExitCode;
  } catch (const std::exception& error) {
    std::cerr << "generate: error: " << error.what() << '\n';
    return 1;
  }
}
