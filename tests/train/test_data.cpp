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

#include "tensor/error.h"
#include "tests/train/text_file.h"
#include "train/corpus.h"
#include "train/data_loader.h"

namespace fs = std::filesystem;
using tessera::train::DataLoader;
using tessera::train::LoaderOptions;
using tessera::train::TokenData;

using tessera::testing::write_file;

namespace {

// A fresh directory under /tmp, removed at the end of the test.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "tessera-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~ScratchDir() { fs::remove_all(path); }
};

// Writes an llm.c token file by hand: header [256 x int32], then the tokens
// (uint16 or uint32, whatever Token is).
template <typename Token>
void write_llmc(const fs::path& path, const std::vector<Token>& tokens, int32_t version, int32_t declared_count) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = version;
  header[2] = declared_count;
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(header.data()), 256 * sizeof(int32_t));
  file.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * sizeof(Token)));
}

// Tokens (i * 7) % 251 + offset: wide when offset puts them at 65,536 or beyond.
TokenData counting_tokens(int64_t count, uint32_t offset = 0) {
  std::vector<uint32_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(static_cast<uint32_t>((i * 7) % 251) + offset);
  TokenData data;
  data.tokens = tessera::train::TokenStream::of_ids(ids);
  data.token_range = 251 + offset;
  data.description = "counting";
  return data;
}

std::string text_of(const tessera::train::TokenStream& tokens) {
  std::string text;
  for (const uint32_t id : tokens.ids()) text.push_back(static_cast<char>(id));
  return text;
}

std::vector<int64_t> values(const tessera::Tensor& tensor) { return tensor.to_vector<int64_t>(); }

// Every row of every micro-batch of `steps` optimizer steps, in global order.
std::vector<int64_t> tokens_seen(const DataLoader& loader, int64_t steps, int64_t grad_accum) {
  std::vector<int64_t> seen;
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t micro = 0; micro < grad_accum; ++micro) {
      auto batch = loader.train_batch(tessera::train::global_micro_batch(step, grad_accum, micro));
      auto inputs = values(batch.inputs);
      seen.insert(seen.end(), inputs.begin(), inputs.end());
    }
  }
  return seen;
}

}  // namespace

TEST_CASE("llm.c token files are read by their magic; broken headers are errors") {
  ScratchDir dir;
  const std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0, 7};
  write_llmc(dir.path / "ok.bin", tokens, 1, 6);
  TokenData data = tessera::train::load_token_file(dir.path / "ok.bin");
  CHECK(data.tokens == tessera::train::TokenStream(tokens));
  CHECK(data.tokens.bytes_per_token() == 2);
  CHECK(data.token_range == 50257);
  CHECK(data.description.find("llm.c token file, 6 tokens") != std::string::npos);

  // Version 2 holds uint32 tokens (llm.c's Llama 3 files): ids past 65,535 come back whole.
  const std::vector<uint32_t> wide = {128000, 9906, 65536, 0, 128255};
  write_llmc(dir.path / "v2.bin", wide, 2, 5);
  TokenData wide_data = tessera::train::load_token_file(dir.path / "v2.bin");
  CHECK(wide_data.tokens.ids() == wide);
  CHECK(wide_data.tokens.bytes_per_token() == 4);
  CHECK(wide_data.token_range == 128256);
  CHECK(tessera::train::token_size_of_file(dir.path / "v2.bin").tokens == 5);
  CHECK(tessera::train::token_size_of_file(dir.path / "v2.bin").bytes == 20);
  write_llmc(dir.path / "v2short.bin", wide, 2, 6);
  CHECK_THROWS_WITH_AS(tessera::train::load_token_file(dir.path / "v2short.bin"),
                       doctest::Contains("header says 6 tokens (24 bytes) but 20 bytes follow"), tessera::Error);
  write_llmc(dir.path / "v3.bin", tokens, 3, 6);
  CHECK_THROWS_WITH_AS(tessera::train::load_token_file(dir.path / "v3.bin"),
                       doctest::Contains("version 3; only versions 1 (uint16 tokens) and 2 (uint32) are read"),
                       tessera::Error);
  write_llmc(dir.path / "short.bin", tokens, 1, 9);
  CHECK_THROWS_WITH_AS(tessera::train::load_token_file(dir.path / "short.bin"),
                       doctest::Contains("header says 9 tokens (18 bytes) but 12 bytes follow"), tessera::Error);
  write_file(dir.path / "stub.bin", std::string("\x88\xd8\x34\x01", 4) + "xyz");  // 20240520, then no header
  CHECK_THROWS_WITH_AS(tessera::train::load_token_file(dir.path / "stub.bin"),
                       doctest::Contains("shorter than the 1024-byte header"), tessera::Error);

  write_file(dir.path / "text.txt", "hello\n");
  TokenData text = tessera::train::load_token_file(dir.path / "text.txt");
  CHECK(text.tokens == tessera::train::TokenStream(std::vector<uint16_t>{'h', 'e', 'l', 'l', 'o', '\n'}));
  write_file(dir.path / "high.txt", "caf\xC3\xA9");  // bytes above 127 are tokens 128-255, not sign-extended
  CHECK(tessera::train::load_token_file(dir.path / "high.txt").tokens.ids() == std::vector<uint32_t>{'c', 'a', 'f', 0xC3, 0xA9});
  CHECK(text.token_range == 'o' + 1);

  write_file(dir.path / "empty.txt", "");
  CHECK_THROWS_WITH_AS(tessera::train::load_token_file(dir.path / "empty.txt"), doctest::Contains("is empty"), tessera::Error);
  CHECK_THROWS_WITH_AS(tessera::train::load_token_file(dir.path / "missing.txt"), doctest::Contains("not a readable file"),
                       tessera::Error);
  CHECK_THROWS_AS(tessera::train::load_token_file(dir.path), tessera::Error);  // a directory
}

TEST_CASE("default corpus: fortunes' plain files, else the licence texts, else a clear error") {
  ScratchDir dir;
  const fs::path fortunes = dir.path / "fortunes", licenses = dir.path / "licenses";
  fs::create_directories(fortunes);
  fs::create_directories(licenses);
  write_file(fortunes / "zen", "b\n%\n");
  write_file(fortunes / "art", "a\n%\n");
  write_file(fortunes / "art.dat", std::string("\0\0\0\2", 4));
  fs::create_symlink("art", fortunes / "art.u8");
  write_file(licenses / "MIT", "mit");
  fs::create_symlink("MIT", licenses / "Expat");

  tessera::train::CorpusLocations locations{fortunes, licenses};
  CHECK(tessera::train::default_corpus_files(locations) == std::vector<fs::path>{fortunes / "art", fortunes / "zen"});
  TokenData corpus = tessera::train::load_default_corpus(locations);
  CHECK(text_of(corpus.tokens) == "a\n%\nb\n%\n");

  tessera::train::CorpusLocations no_fortunes{dir.path / "absent", licenses};
  CHECK(tessera::train::default_corpus_files(no_fortunes) == std::vector<fs::path>{licenses / "MIT"});
  CHECK(tessera::train::load_default_corpus(no_fortunes).tokens.size() == 3);

  tessera::train::CorpusLocations nothing{dir.path / "absent", dir.path / "absent too"};
  CHECK(tessera::train::default_corpus_files(nothing).empty());
  CHECK_THROWS_WITH_AS(tessera::train::load_default_corpus(nothing), doctest::Contains("absent too"), tessera::Error);

  // Every Debian has the licence texts, so the real default always loads.
  CHECK(tessera::train::load_default_corpus().tokens.size() > 100000);
}

TEST_CASE("unigram entropy in nats, of a stream's first tokens, narrow or wide") {
  auto entropy = [](std::vector<uint32_t> ids) {
    const tessera::train::TokenStream tokens = tessera::train::TokenStream::of_ids(ids);
    return tessera::train::unigram_entropy(tokens, tokens.size());
  };
  // -sum p ln p in f64 over a few symbols: Approx's 1e-5 is far above its rounding.
  CHECK(entropy({3, 3, 3}) == doctest::Approx(0.0));
  CHECK(entropy({0, 1, 2, 3, 3, 2, 1, 0}) == doctest::Approx(std::log(4.0)));
  // p = (1/2, 1/4, 1/4): H = 1.5 bits.
  CHECK(entropy({9, 9, 4, 5}) == doctest::Approx(1.5 * std::log(2.0)));
  // Wide ids, one up to 2^32 - 1, give the same figure as narrow ids of the same frequencies, bit for bit.
  CHECK(entropy({4000000000u, 4000000000u, 70000, 4294967295u}) == entropy({9, 9, 4, 5}));
  const tessera::train::TokenStream tokens = tessera::train::TokenStream::of_ids(std::vector<uint32_t>{1, 1, 2, 2});
  CHECK(tessera::train::unigram_entropy(tokens, 2) == 0.0);
  CHECK(tessera::train::unigram_entropy(tokens, 0) == 0.0);
  CHECK_THROWS_WITH_AS(tessera::train::unigram_entropy(tokens, 5), doctest::Contains("5 tokens asked of a stream of 4"),
                       tessera::Error);
}

TEST_CASE("token streams: the narrow width while every id fits it, else the wide") {
  const tessera::train::TokenStream narrow = tessera::train::TokenStream::of_ids(std::vector<uint32_t>{0, 65535, 7});
  CHECK(narrow.bytes_per_token() == 2);
  CHECK(narrow.bytes().size() == 6);
  CHECK(narrow.range() == 65536);
  CHECK(narrow[1] == 65535);
  const tessera::train::TokenStream wide = tessera::train::TokenStream::of_ids(std::vector<uint32_t>{0, 65536, 7});
  CHECK(wide.bytes_per_token() == 4);
  CHECK(wide.bytes().size() == 12);
  CHECK(wide.range() == 65537);
  CHECK(wide.ids() == std::vector<uint32_t>{0, 65536, 7});
  CHECK(tessera::train::TokenStream().range() == 0);
  CHECK(narrow != tessera::train::TokenStream::of_ids(std::vector<uint32_t>{0, 65535, 8}));
  std::vector<int64_t> window(2);
  wide.copy_to(1, window);
  CHECK(window == std::vector<int64_t>{65536, 7});
  CHECK_THROWS_WITH_AS(wide.copy_to(2, window), doctest::Contains("tokens [2, 4) are outside the stream's 3"),
                       tessera::Error);
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

TEST_CASE("wide tokens make the same windows as narrow ones, ids and all") {
  const LoaderOptions options{.batch = 3, .seq_len = 8, .seed = 7};
  const DataLoader narrow(counting_tokens(4000), options);
  const DataLoader wide(counting_tokens(4000, 100000), options);
  REQUIRE(wide.token_data()->tokens.bytes_per_token() == 4);
  CHECK(wide.token_range() == 100251);
  CHECK(wide.unigram_entropy() == narrow.unigram_entropy());
  for (int64_t m = 0; m < 5; ++m) {
    std::vector<int64_t> shifted = values(narrow.train_batch(m).targets);
    for (int64_t& token : shifted) token += 100000;
    CHECK(values(wide.train_batch(m).targets) == shifted);
  }
}

TEST_CASE("validation batches come from the held-out tail") {
  std::vector<uint16_t> tokens(1000, 1);
  std::fill(tokens.begin() + 950, tokens.end(), 2);  // the last 5%
  TokenData data;
  data.tokens = tessera::train::TokenStream(std::move(tokens));
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
