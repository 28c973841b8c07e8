// The GPT example's data: llm.c token files, the default corpus and its
// fallback, the unigram entropy, and micro-batches that depend only on the
// seed and the global micro-batch index.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "examples/gpt/corpus.h"
#include "examples/gpt/data_loader.h"
#include "tensor/error.h"

namespace fs = std::filesystem;
using gpt::DataLoader;
using gpt::LoaderOptions;
using gpt::TokenData;

namespace {

// A fresh directory under /tmp, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tessera-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
}

// Writes an llm.c token file by hand: header [256 x int32], then uint16 tokens.
void write_llmc(const fs::path& path, const std::vector<uint16_t>& tokens, int32_t version, int32_t declared_count) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = version;
  header[2] = declared_count;
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(header.data()), 256 * sizeof(int32_t));
  file.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
}

TokenData counting_tokens(int64_t count) {
  TokenData data;
  for (int64_t i = 0; i < count; ++i) data.tokens.push_back(static_cast<uint16_t>((i * 7) % 251));
  data.token_range = 251;
  data.description = "counting";
  return data;
}

std::vector<int64_t> values(const tessera::Tensor& tensor) { return tensor.to_vector<int64_t>(); }

// Every row of every micro-batch of `steps` optimizer steps, in global order.
std::vector<int64_t> tokens_seen(const DataLoader& loader, int64_t steps, int64_t grad_accum) {
  std::vector<int64_t> seen;
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t micro = 0; micro < grad_accum; ++micro) {
      auto batch = loader.train_batch(gpt::global_micro_batch(step, grad_accum, micro));
      auto inputs = values(batch.inputs);
      seen.insert(seen.end(), inputs.begin(), inputs.end());
    }
  }
  return seen;
}

}  // namespace

TEST_CASE("llm.c token files are read by their magic; broken headers are errors") {
  TempDir dir;
  const std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0, 7};
  write_llmc(dir.path / "ok.bin", tokens, 1, 6);
  TokenData data = gpt::load_token_file(dir.path / "ok.bin");
  CHECK(data.tokens == tokens);
  CHECK(data.token_range == 50257);
  CHECK(data.description.find("llm.c token file, 6 tokens") != std::string::npos);

  write_llmc(dir.path / "v2.bin", tokens, 2, 6);
  CHECK_THROWS_WITH_AS(gpt::load_token_file(dir.path / "v2.bin"), doctest::Contains("version 2"), tessera::Error);
  write_llmc(dir.path / "short.bin", tokens, 1, 9);
  CHECK_THROWS_WITH_AS(gpt::load_token_file(dir.path / "short.bin"),
                       doctest::Contains("header says 9 tokens (18 bytes) but 12 bytes follow"), tessera::Error);
  write_file(dir.path / "stub.bin", std::string("\x88\xd8\x34\x01", 4) + "xyz");  // 20240520, then no header
  CHECK_THROWS_WITH_AS(gpt::load_token_file(dir.path / "stub.bin"),
                       doctest::Contains("shorter than the 1024-byte header"), tessera::Error);

  write_file(dir.path / "text.txt", "hello\n");
  TokenData text = gpt::load_token_file(dir.path / "text.txt");
  CHECK(text.tokens == std::vector<uint16_t>{'h', 'e', 'l', 'l', 'o', '\n'});
  CHECK(text.token_range == 'o' + 1);

  write_file(dir.path / "empty.txt", "");
  CHECK_THROWS_WITH_AS(gpt::load_token_file(dir.path / "empty.txt"), doctest::Contains("is empty"), tessera::Error);
  CHECK_THROWS_WITH_AS(gpt::load_token_file(dir.path / "missing.txt"), doctest::Contains("not a readable file"),
                       tessera::Error);
  CHECK_THROWS_AS(gpt::load_token_file(dir.path), tessera::Error);  // a directory
}

TEST_CASE("default corpus: fortunes' plain files, else the licence texts, else a clear error") {
  TempDir dir;
  const fs::path fortunes = dir.path / "fortunes", licenses = dir.path / "licenses";
  fs::create_directories(fortunes);
  fs::create_directories(licenses);
  write_file(fortunes / "zen", "b\n%\n");
  write_file(fortunes / "art", "a\n%\n");
  write_file(fortunes / "art.dat", std::string("\0\0\0\2", 4));
  fs::create_symlink("art", fortunes / "art.u8");
  write_file(licenses / "MIT", "mit");
  fs::create_symlink("MIT", licenses / "Expat");

  gpt::CorpusLocations locations{fortunes, licenses};
  CHECK(gpt::default_corpus_files(locations) == std::vector<fs::path>{fortunes / "art", fortunes / "zen"});
  TokenData corpus = gpt::load_default_corpus(locations);
  CHECK(std::string(corpus.tokens.begin(), corpus.tokens.end()) == "a\n%\nb\n%\n");

  gpt::CorpusLocations no_fortunes{dir.path / "absent", licenses};
  CHECK(gpt::default_corpus_files(no_fortunes) == std::vector<fs::path>{licenses / "MIT"});
  CHECK(gpt::load_default_corpus(no_fortunes).tokens.size() == 3);

  gpt::CorpusLocations nothing{dir.path / "absent", dir.path / "absent too"};
  CHECK(gpt::default_corpus_files(nothing).empty());
  CHECK_THROWS_WITH_AS(gpt::load_default_corpus(nothing), doctest::Contains("absent too"), tessera::Error);

  // Every Debian has the licence texts, so the real default always loads.
  CHECK(gpt::load_default_corpus().tokens.size() > 100000);
}

TEST_CASE("unigram entropy in nats") {
  // -sum p ln p in f64 over a few symbols: Approx's 1e-5 is far above its rounding.
  CHECK(gpt::unigram_entropy(std::vector<uint16_t>{3, 3, 3}) == doctest::Approx(0.0));
  CHECK(gpt::unigram_entropy(std::vector<uint16_t>{0, 1, 2, 3, 3, 2, 1, 0}) == doctest::Approx(std::log(4.0)));
  // p = (1/2, 1/4, 1/4): H = 1.5 bits.
  CHECK(gpt::unigram_entropy(std::vector<uint16_t>{9, 9, 4, 5}) == doctest::Approx(1.5 * std::log(2.0)));
}

TEST_CASE("micro-batches depend only on the seed and the global index, not on the grad_accum split") {
  const LoaderOptions options{.batch = 3, .seq_len = 8, .seed = 7};
  DataLoader loader(counting_tokens(4000), options);
  const auto by_one = tokens_seen(loader, 8, 1);
  CHECK(by_one == tokens_seen(loader, 2, 4));
  CHECK(by_one == tokens_seen(loader, 4, 2));
  CHECK(by_one == tokens_seen(DataLoader(counting_tokens(4000), options), 8, 1));
  CHECK(by_one != tokens_seen(DataLoader(counting_tokens(4000), {.batch = 3, .seq_len = 8, .seed = 8}), 8, 1));

  // Each row is a window of the training split; targets are inputs shifted by one.
  CHECK(loader.train_tokens() == 3800);
  CHECK(loader.val_tokens() == 200);
  for (int64_t m = 0; m < 20; ++m) {
    auto batch = loader.train_batch(m);
    CHECK(batch.inputs.sizes() == tessera::Shape{3, 8});
    auto inputs = values(batch.inputs), targets = values(batch.targets);
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t t = 0; t + 1 < 8; ++t) CHECK(targets[b * 8 + t] == inputs[b * 8 + t + 1]);
      CHECK((targets[b * 8 + 7] - inputs[b * 8 + 7] + 251) % 251 == 7);
    }
  }
  CHECK(values(loader.train_batch(0).inputs) != values(loader.train_batch(1).inputs));
  CHECK(values(loader.val_batch(0).inputs) == values(loader.val_batch(0).inputs));
}

TEST_CASE("validation batches come from the held-out tail") {
  TokenData data;
  data.tokens.assign(1000, 1);
  std::fill(data.tokens.begin() + 950, data.tokens.end(), 2);  // the last 5%
  data.token_range = 3;
  DataLoader loader(std::move(data), {.batch = 4, .seq_len = 16, .seed = 1});
  for (int64_t i = 0; i < 10; ++i) {
    for (int64_t token : values(loader.val_batch(i).inputs)) CHECK(token == 2);
    for (int64_t token : values(loader.train_batch(i).targets)) CHECK(token == 1);
  }
  CHECK(loader.unigram_entropy() == doctest::Approx(0.0));  // of the training split only
}

TEST_CASE("synthetic tokens: below the vocab, seeded, ln(vocab) entropy") {
  DataLoader loader = DataLoader::synthetic(50, {.batch = 2, .seq_len = 32, .seed = 3});
  CHECK(loader.is_synthetic());
  CHECK(loader.token_range() == 50);
  CHECK(loader.unigram_entropy() == std::log(50.0));  // uniform by construction: ln(vocab) itself
  auto batch = loader.train_batch(5);
  auto inputs = values(batch.inputs), targets = values(batch.targets);
  for (int64_t token : inputs) CHECK((token >= 0 && token < 50));
  for (int64_t t = 0; t + 1 < 32; ++t) CHECK(targets[t] == inputs[t + 1]);
  CHECK(inputs == values(DataLoader::synthetic(50, {.batch = 2, .seq_len = 32, .seed = 3}).train_batch(5).inputs));
  CHECK(inputs != values(DataLoader::synthetic(50, {.batch = 2, .seq_len = 32, .seed = 4}).train_batch(5).inputs));
  CHECK(inputs != values(loader.val_batch(5).inputs));
}

TEST_CASE("loader errors: splits too small for a sequence, bad options") {
  CHECK_THROWS_WITH_AS(DataLoader(counting_tokens(100), {.batch = 1, .seq_len = 8, .seed = 0}),
                       doctest::Contains("each split needs at least seq_len + 1 = 9 tokens"), tessera::Error);
  CHECK_THROWS_WITH_AS(DataLoader(counting_tokens(4000), {.batch = 0, .seq_len = 8, .seed = 0}),
                       doctest::Contains("batch must be >= 1, got 0"), tessera::Error);
  CHECK_THROWS_WITH_AS(DataLoader::synthetic(0, {.batch = 1, .seq_len = 8, .seed = 0}),
                       doctest::Contains("synthetic vocab must be >= 1, got 0"), tessera::Error);
  DataLoader loader(counting_tokens(4000), {.batch = 1, .seq_len = 8, .seed = 0});
  CHECK_THROWS_AS(loader.train_batch(-1), tessera::Error);
}
