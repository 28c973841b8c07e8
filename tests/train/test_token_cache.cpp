// train --tokenizer: the flag sets the vocabulary from the tokenizer's ids
// and refuses what cannot go with it; build_data tokenizes the text, caches
// the tokens in --ckpt-dir and reads them back on the next launch while the
// tokenizer's files and the text are the same, and tokenizes again when the
// cache is damaged or either changed. Ids past 65,535 are held and cached
// wide, and train.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/checkpoint/temp_dir.h"
#include "tests/train/text_file.h"
#include "train/flag_checks.h"
#include "train/token_cache.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "train/training_run.h"

namespace fs = std::filesystem;
using tessera::checkpoint::testing::TempDir;

using tessera::testing::write_file;

namespace {

const fs::path kGpt2Tokenizer = fs::path(TESSERA_TOKENIZER_GOLDEN_DIR) / "gpt2" / "tokenizer.json";

// parse_command_line's exit code (nullopt: go on) and its error text.
std::pair<std::optional<int>, std::string> parse_into(std::vector<const char*> args, tessera::train::TrainConfig& config) {
  args.insert(args.begin(), "train");
  std::ostringstream out, err;
  const std::optional<int> code = tessera::train::parse_command_line(static_cast<int>(args.size()), args.data(), config, out, err);
  return {code, err.str()};
}

std::string some_text() {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "The tokenizer's words, caf\xC3\xA9 and \xE6\x97\xA5\xE6\x9C\xAC, line " + std::to_string(i) + ".\n";
  return text;
}

}  // namespace

TEST_CASE("train --tokenizer: the vocabulary is the tokenizer's, and clashing flags are refused") {
  const std::string tokenizer = kGpt2Tokenizer.string();
  tessera::train::TrainConfig config;
  CHECK(!parse_into({"--tokenizer", tokenizer.c_str(), "--plan"}, config).first);
  CHECK(tessera::train::vocab_size(config.model_config()) == 659);
  tessera::train::TrainConfig llama;
  CHECK(!parse_into({"--model", "llama", "--tokenizer", tokenizer.c_str(), "--plan"}, llama).first);
  CHECK(tessera::train::vocab_size(llama.model_config()) == 659);

  tessera::train::TrainConfig refused;
  auto [code, err] = parse_into({"--tokenizer", tokenizer.c_str(), "--vocab", "700"}, refused);
  CHECK(code == tessera::train::kUsageExitCode);
  CHECK(err.find("--vocab and --tokenizer both set the vocabulary") != std::string::npos);
  std::tie(code, err) = parse_into({"--tokenizer", tokenizer.c_str(), "--data", "synthetic"}, refused);
  CHECK(code == tessera::train::kUsageExitCode);
  CHECK(err.find("--data synthetic has none") != std::string::npos);
  std::tie(code, err) = parse_into({"--tokenizer", "/nonexistent/tokenizer.json"}, refused);
  CHECK(code == tessera::train::kUsageExitCode);
  CHECK(err.find("/nonexistent/tokenizer.json") != std::string::npos);
}

TEST_CASE("train --tokenizer: the text's tokens are cached in --ckpt-dir and read back while nothing changed") {
  TempDir dir;
  const std::string text = some_text();
  write_file(dir.path / "text.txt", text);
  tessera::train::TrainConfig config;
  std::vector<const char*> args = {"--tokenizer", "",        "--data", "",           "--seq-len",
                                   "16",          "--batch", "2",      "--ckpt-dir", ""};
  const std::string tokenizer = kGpt2Tokenizer.string(), data = dir / "text.txt", ckpt = dir / "ckpt";
  args[1] = tokenizer.c_str();
  args[3] = data.c_str();
  args[9] = ckpt.c_str();
  REQUIRE(!parse_into(args, config).first);

  tessera::train::Tokenizer reference = tessera::train::Tokenizer::load(kGpt2Tokenizer);
  const std::vector<uint32_t> ids = reference.encode(text);
  const fs::path cache = tessera::train::token_cache_path(ckpt, reference, text);

  const tessera::train::DataLoader first = tessera::train::build_data(config);
  CHECK(first.note() == "tokens cached in " + cache.string());
  CHECK(first.token_data()->tokens == tessera::train::TokenStream(std::vector<uint16_t>(ids.begin(), ids.end())));
  CHECK(first.description().find("tokenized by") != std::string::npos);
  CHECK(fs::is_regular_file(cache));

  const tessera::train::DataLoader second = tessera::train::build_data(config);
  CHECK(second.note() == "tokens read from the cache " + cache.string());
  CHECK(second.token_data()->tokens == first.token_data()->tokens);
  CHECK(second.description() == first.description());  // the run's identity holds it

  fs::resize_file(cache, 1000);  // a damaged cache is tokenized again, and replaced
  const tessera::train::DataLoader third = tessera::train::build_data(config);
  CHECK(third.note().find("was unreadable") != std::string::npos);
  CHECK(third.token_data()->tokens == first.token_data()->tokens);
  CHECK(tessera::train::build_data(config).note() == "tokens read from the cache " + cache.string());

  write_file(dir.path / "text.txt", text + "more");  // other text: another cache file
  CHECK(tessera::train::build_data(config).note().starts_with("tokens cached in "));
  CHECK(std::distance(fs::directory_iterator(ckpt), fs::directory_iterator()) == 2);

  config.ckpt_dir.clear();
  CHECK(tessera::train::build_data(config).note().starts_with("tokens not cached"));
}

TEST_CASE("train --tokenizer: token files and a vocabulary other than the tokenizer's are refused") {
  TempDir dir;
  tessera::train::TrainConfig config;
  config.tokenizer = kGpt2Tokenizer.string();
  config.model.vocab_size = 659;
  config.seq_len = 16;
  config.batch = 2;
  std::vector<int32_t> header(256, 0);
  header[0] = tessera::train::kLlmcMagic, header[1] = tessera::train::kLlmcVersion, header[2] = 4;
  std::string llmc(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  llmc += std::string(8, '\x01');
  write_file(dir.path / "tokens.bin", llmc);
  config.data = dir / "tokens.bin";
  CHECK_THROWS_WITH_AS(tessera::train::build_data(config), doctest::Contains("llm.c token file"), tessera::Error);
  write_file(dir.path / "text.txt", some_text());
  config.data = dir / "text.txt";
  config.model.vocab_size = 700;
  CHECK_THROWS_WITH_AS(tessera::train::build_data(config), doctest::Contains("has 659 ids"), tessera::Error);
}

TEST_CASE("train --tokenizer with ids past 65,535: wide tokens, cached as llm.c's version 2, and trained") {
  TempDir dir;
  // The golden Llama 3-style tokenizer plus a special token at id 70000, as Llama 3's sit at 128,000 and up.
  nlohmann::json spec = nlohmann::json::parse(
      std::ifstream(fs::path(TESSERA_TOKENIZER_GOLDEN_DIR) / "llama3" / "tokenizer.json"));
  spec["added_tokens"].push_back({{"id", 70000},
                                  {"content", "<|wide|>"},
                                  {"single_word", false},
                                  {"lstrip", false},
                                  {"rstrip", false},
                                  {"normalized", false},
                                  {"special", true}});
  write_file(dir.path / "tokenizer.json", spec.dump());
  std::string text;
  for (int i = 0; i < 100; ++i) text += "<|wide|>Line " + std::to_string(i) + " of the text, caf\xC3\xA9.\n";
  write_file(dir.path / "text.txt", text);

  const std::string tokenizer = dir / "tokenizer.json", data = dir / "text.txt", ckpt = dir / "ckpt";
  tessera::train::TrainConfig config;
  REQUIRE(!parse_into({"--tokenizer", tokenizer.c_str(), "--data", data.c_str(), "--seq-len", "16", "--batch", "2",
                  "--steps", "3", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--ckpt-dir", ckpt.c_str(),
                  "--ckpt-every", "0", "--eval-every", "0"},
                 config)
               .first);
  CHECK(tessera::train::vocab_size(config.model_config()) == 70001);

  tessera::train::Tokenizer reference = tessera::train::Tokenizer::load(tokenizer);
  const std::vector<uint32_t> ids = reference.encode(text);
  REQUIRE(std::count(ids.begin(), ids.end(), 70000u) == 100);
  const tessera::train::DataLoader first = tessera::train::build_data(config);
  const tessera::train::TokenStream& tokens = first.token_data()->tokens;
  CHECK(tokens.bytes_per_token() == 4);
  CHECK(tokens.ids() == ids);
  CHECK(first.token_range() == 70001);

  // The cache is llm.c's version 2 file, and it reads back as the same wide stream.
  const fs::path cache = tessera::train::token_cache_path(ckpt, reference, text);
  REQUIRE(fs::is_regular_file(cache));
  std::ifstream cached(cache, std::ios::binary);
  int32_t header[3] = {};
  cached.read(reinterpret_cast<char*>(header), sizeof(header));
  CHECK(header[0] == tessera::train::kLlmcMagic);
  CHECK(header[1] == tessera::train::kLlmcWideVersion);
  CHECK(header[2] == static_cast<int32_t>(ids.size()));
  CHECK(static_cast<int64_t>(fs::file_size(cache)) == 1024 + 4 * static_cast<int64_t>(ids.size()));
  const tessera::train::DataLoader second = tessera::train::build_data(config);
  CHECK(second.note() == "tokens read from the cache " + cache.string());
  CHECK(second.token_data()->tokens == tokens);

  // An untrained model guesses about uniformly over 70,001 ids: ln 70001 = 11.16.
  std::ostringstream log;
  const tessera::train::TrainSummary summary = tessera::train::train(config, log);
  INFO("log:\n" << log.str());
  REQUIRE(summary.losses.size() == 3);
  CHECK(summary.losses.front() == doctest::Approx(std::log(70001.0)).epsilon(0.02));
  CHECK(summary.losses.back() < summary.losses.front());
}
