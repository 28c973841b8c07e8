// Tokenizing a corpus, through a cache file in llm.c's format.
#include "train/token_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <limits>

#include "checkpoint/checksum.h"
#include "checkpoint/file_io.h"
#include "tensor/error.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// Bumped whenever the tokenizer's output for the same files could change.
constexpr int kCacheVersion = 1;

void write_llmc_file(const fs::path& path, const TokenStream& tokens) {
  std::array<int32_t, kLlmcHeaderInts> header{};
  header[0] = kLlmcMagic;
  header[1] = llmc_version_of(tokens);
  header[2] = static_cast<int32_t>(tokens.size());
  const fs::path temporary = path.string() + fmt::format(".tmp-{}", ::getpid());
  try {
    tessera::checkpoint::WriteFile file(temporary.string());
    file.write(header.data(), static_cast<int64_t>(sizeof(header)));
    file.write(tokens.bytes().data(), static_cast<int64_t>(tokens.bytes().size()));
    file.close(/*sync=*/true);
    fs::rename(temporary, path);
  } catch (...) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw;
  }
}

TokenData encode(const CorpusText& corpus, Tokenizer& tokenizer) {
  const std::vector<uint32_t> ids = tokenizer.encode(corpus.text);
  TokenData data;
  data.tokens = TokenStream::of_ids(ids);
  data.token_range = data.tokens.range();
  return data;
}

}  // namespace

fs::path token_cache_path(const fs::path& directory, const Tokenizer& tokenizer, const std::string& text) {
  return directory / fmt::format("tokens-v{}-{:08x}-{:08x}-{}.bin", kCacheVersion, tokenizer.content_crc32c(),
                                 tessera::checkpoint::crc32c(text.data(), text.size()), text.size());
}

TokenData tokenize_corpus(const CorpusText& corpus, Tokenizer& tokenizer, const std::string& cache_directory) {
  TokenData data;
  std::string note;
  const fs::path cache =
      cache_directory.empty() ? fs::path() : token_cache_path(cache_directory, tokenizer, corpus.text);
  std::error_code error;
  if (!cache.empty() && fs::is_regular_file(cache, error)) {
    try {
      data = load_token_file(cache);
      note = fmt::format("tokens read from the cache {}", cache.string());
    } catch (const tessera::Error& failure) {
      data = TokenData{};
      note = fmt::format("the cache {} was unreadable ({}); tokenized again", cache.string(), failure.what());
    }
  }
  if (data.tokens.empty()) {
    data = encode(corpus, tokenizer);
    TESSERA_CHECK(!data.tokens.empty(), "data: {} gives no tokens", corpus.description);
    if (cache.empty()) {
      note = "tokens not cached (a run with --ckpt-dir caches them there)";
    } else if (data.tokens.size() > std::numeric_limits<int32_t>::max()) {
      note = "tokens not cached: more than llm.c's format counts";
    } else {
      try {
        fs::create_directories(cache_directory);
        write_llmc_file(cache, data.tokens);
        if (note.empty()) note = fmt::format("tokens cached in {}", cache.string());
      } catch (const std::exception& failure) {  // the run goes on; the next launch tokenizes again
        note = fmt::format("tokens not cached: {}", failure.what());
      }
    }
  }
  data.description =
      fmt::format("{} tokenized by {}: {} tokens", corpus.description, tokenizer.source(), data.tokens.size());
  data.note = std::move(note);
  return data;
}

}  // namespace tessera::train
