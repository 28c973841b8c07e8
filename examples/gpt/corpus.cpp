// Reading text and llm.c token files, and finding the default corpus.
#include "examples/gpt/corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "tensor/error.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  TESSERA_CHECK(file, "data: cannot open '{}'", path.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  TESSERA_CHECK(!file.bad(), "data: error while reading '{}'", path.string());
  return bytes;
}

int64_t range_of(const std::vector<uint16_t>& tokens) {
  if (tokens.empty()) return 0;
  return static_cast<int64_t>(*std::max_element(tokens.begin(), tokens.end())) + 1;
}

bool starts_with_llmc_magic(const std::vector<char>& bytes) {
  if (bytes.size() < sizeof(int32_t)) return false;
  int32_t magic = 0;
  std::memcpy(&magic, bytes.data(), sizeof(magic));
  return magic == kLlmcMagic;
}

// bytes: header [256 x int32] then [count x uint16].
TokenData parse_llmc(const std::vector<char>& bytes, const fs::path& path) {
  const int64_t header_bytes = kLlmcHeaderInts * static_cast<int64_t>(sizeof(int32_t));
  TESSERA_CHECK(static_cast<int64_t>(bytes.size()) >= header_bytes,
                "data: '{}' has llm.c's magic but is {} bytes long, shorter than the {}-byte header", path.string(),
                bytes.size(), header_bytes);
  std::array<int32_t, kLlmcHeaderInts> header{};
  std::memcpy(header.data(), bytes.data(), header_bytes);
  TESSERA_CHECK(header[1] == kLlmcVersion, "data: '{}' is an llm.c token file of version {}; only version {} is read",
                path.string(), header[1], kLlmcVersion);
  const int64_t count = header[2];
  const int64_t payload = static_cast<int64_t>(bytes.size()) - header_bytes;
  TESSERA_CHECK(count > 0 && payload == count * 2,
                "data: '{}' header says {} tokens ({} bytes) but {} bytes follow the header", path.string(), count,
                count * 2, payload);
  TokenData data;
  data.tokens.resize(static_cast<size_t>(count));
  std::memcpy(data.tokens.data(), bytes.data() + header_bytes, static_cast<size_t>(payload));
  data.token_range = range_of(data.tokens);
  data.description = fmt::format("{} (llm.c token file, {} tokens)", path.string(), count);
  return data;
}

TokenData bytes_to_tokens(const std::vector<char>& bytes, std::string description) {
  TokenData data;
  data.tokens.reserve(bytes.size());
  for (char byte : bytes) data.tokens.push_back(static_cast<unsigned char>(byte));
  data.token_range = range_of(data.tokens);
  data.description = std::move(description);
  return data;
}

std::vector<fs::path> plain_files_in(const fs::path& directory, bool skip_dat) {
  std::vector<fs::path> files;
  std::error_code error;
  if (!fs::is_directory(directory, error)) return files;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    if (skip_dat && entry.path().extension() == ".dat") continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TokenData load_token_file(const fs::path& path) {
  std::error_code error;
  TESSERA_CHECK(fs::is_regular_file(path, error),
                "data: '{}' is not a readable file (--data takes a file or 'synthetic')", path.string());
  std::vector<char> bytes = read_bytes(path);
  TESSERA_CHECK(!bytes.empty(), "data: '{}' is empty", path.string());
  if (starts_with_llmc_magic(bytes)) return parse_llmc(bytes, path);
  return bytes_to_tokens(bytes, fmt::format("{} (text, {} bytes)", path.string(), bytes.size()));
}

int64_t token_count_of_file(const fs::path& path) {
  std::error_code error;
  const uintmax_t size = fs::file_size(path, error);
  if (error) return 0;
  std::ifstream file(path, std::ios::binary);
  std::vector<char> magic(sizeof(int32_t));
  if (!file.read(magic.data(), static_cast<std::streamsize>(magic.size())) || !starts_with_llmc_magic(magic)) {
    return static_cast<int64_t>(size);  // text: one token per byte
  }
  const int64_t header_bytes = kLlmcHeaderInts * static_cast<int64_t>(sizeof(int32_t));
  return std::max<int64_t>(0, (static_cast<int64_t>(size) - header_bytes) / 2);
}

TokenData load_text_files(const std::vector<fs::path>& files, const std::string& description) {
  std::vector<char> bytes;
  for (const auto& file : files) {
    std::vector<char> part = read_bytes(file);
    bytes.insert(bytes.end(), part.begin(), part.end());
  }
  TESSERA_CHECK(!bytes.empty(), "data: {} holds no text", description);
  return bytes_to_tokens(bytes, fmt::format("{} (text, {} files, {} bytes)", description, files.size(), bytes.size()));
}

std::vector<fs::path> default_corpus_files(const CorpusLocations& locations) {
  std::vector<fs::path> files = plain_files_in(locations.fortunes, /*skip_dat=*/true);
  if (!files.empty()) return files;
  return plain_files_in(locations.licenses, /*skip_dat=*/false);
}

TokenData load_default_corpus(const CorpusLocations& locations) {
  std::vector<fs::path> files = default_corpus_files(locations);
  TESSERA_CHECK(!files.empty(),
                "data: no default corpus: neither '{}' (Debian package fortunes) nor '{}' holds a file; "
                "run tools/setup.sh or pass --data PATH",
                locations.fortunes.string(), locations.licenses.string());
  return load_text_files(files, files.front().parent_path().string());
}

double unigram_entropy(std::span<const uint16_t> tokens) {
  if (tokens.empty()) return 0.0;
  std::vector<int64_t> counts(65536, 0);
  for (uint16_t token : tokens) ++counts[token];
  const double total = static_cast<double>(tokens.size());
  double entropy = 0.0;
  for (int64_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / total;
    entropy -= p * std::log(p);
  }
  return entropy;
}

}  // namespace gpt
