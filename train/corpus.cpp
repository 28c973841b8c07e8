// Reading text and llm.c token files, and finding the default corpus.
#include "train/corpus.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>
#include <optional>

#include "checkpoint/file_io.h"
#include "tensor/error.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// Through checkpoint::ReadFile, like every input: a FIFO put in place of a
// checked file is refused, never waited on.
std::vector<char> read_bytes(const fs::path& path) {
  try {
    const checkpoint::ReadFile file(path.string());
    std::vector<char> bytes(static_cast<size_t>(file.size()));
    file.read_at(0, bytes.data(), file.size());
    return bytes;
  } catch (const tessera::Error& error) {
    tessera::fail("data: {}", error.what());
  }
}

bool starts_with_llmc_magic(const std::vector<char>& bytes) {
  if (bytes.size() < sizeof(int32_t)) return false;
  int32_t magic = 0;
  std::memcpy(&magic, bytes.data(), sizeof(magic));
  return magic == kLlmcMagic;
}

int64_t llmc_header_bytes() { return kLlmcHeaderInts * static_cast<int64_t>(sizeof(int32_t)); }

// The width of a token in llm.c's format `version`; 0 for a version not read.
int64_t llmc_token_bytes(int32_t version) {
  if (version == kLlmcVersion) return sizeof(uint16_t);
  if (version == kLlmcWideVersion) return sizeof(uint32_t);
  return 0;
}

template <typename Token>
TokenStream tokens_from_bytes(const char* bytes, int64_t count) {
  std::vector<Token> tokens(static_cast<size_t>(count));
  std::memcpy(tokens.data(), bytes, static_cast<size_t>(count) * sizeof(Token));
  return TokenStream(std::move(tokens));
}

// bytes: header [256 x int32] then [count x uint16] (version 1) or [count x uint32] (version 2).
TokenData parse_llmc(const std::vector<char>& bytes, const fs::path& path) {
  const int64_t header_bytes = llmc_header_bytes();
  TESSERA_CHECK(static_cast<int64_t>(bytes.size()) >= header_bytes,
                "data: '{}' has llm.c's magic but is {} bytes long, shorter than the {}-byte header", path.string(),
                bytes.size(), header_bytes);
  std::array<int32_t, kLlmcHeaderInts> header{};
  std::memcpy(header.data(), bytes.data(), header_bytes);
  const int64_t token_bytes = llmc_token_bytes(header[1]);
  TESSERA_CHECK(token_bytes != 0,
                "data: '{}' is an llm.c token file of version {}; only versions {} (uint16 tokens) and {} (uint32) "
                "are read",
                path.string(), header[1], kLlmcVersion, kLlmcWideVersion);
  const int64_t count = header[2];
  const int64_t payload = static_cast<int64_t>(bytes.size()) - header_bytes;
  TESSERA_CHECK(count > 0 && payload == count * token_bytes,
                "data: '{}' header says {} tokens ({} bytes) but {} bytes follow the header", path.string(), count,
                count * token_bytes, payload);
  TokenData data;
  const char* first = bytes.data() + header_bytes;
  data.tokens =
      token_bytes == 2 ? tokens_from_bytes<uint16_t>(first, count) : tokens_from_bytes<uint32_t>(first, count);
  data.token_range = data.tokens.range();
  data.description = fmt::format("{} (llm.c token file, {} tokens)", path.string(), count);
  return data;
}

TokenData bytes_to_tokens(std::string_view bytes, std::string description) {
  TokenData data;
  std::vector<uint16_t> tokens(bytes.size());
  std::transform(bytes.begin(), bytes.end(), tokens.begin(),
                 [](char byte) { return static_cast<unsigned char>(byte); });
  data.tokens = TokenStream(std::move(tokens));
  data.token_range = data.tokens.range();
  data.description = std::move(description);
  return data;
}

constexpr char kBackspace = '\b';
constexpr char kBell = '\a';

bool is_letter_or_digit(const std::string& character) {
  const unsigned char first = static_cast<unsigned char>(character.front());
  return first >= 0x80 || std::isalnum(first);  // a UTF-8 character counts as a letter
}

// What a column shows once `typed` is struck over `shown`.
std::string overstrike(const std::string& shown, const std::string& typed) {
  if (typed == "_") return shown;  // underline: _ over X
  if (shown == "_") return typed;  // underline: X over _
  if (is_letter_or_digit(shown) && !is_letter_or_digit(typed)) return shown;  // an accent over a letter
  return typed;  // bold (X over X), a letter over an accent
}

// One line (no newline) with backspaces in it, replayed column by column;
// a column holds one character (a UTF-8 sequence whole).
void render_line(std::string_view line, std::string& out) {
  std::vector<std::string> columns;
  size_t column = 0;
  bool in_sequence = false;  // the previous byte began or continued a UTF-8 sequence
  for (const char byte : line) {
    const unsigned char value = static_cast<unsigned char>(byte);
    if (byte == kBell) continue;
    if (byte == kBackspace) {
      if (column > 0) --column;
      in_sequence = false;
      continue;
    }
    if (in_sequence && (value & 0xC0) == 0x80) {  // a continuation byte: part of the character before
      columns[column - 1].push_back(byte);
      continue;
    }
    const std::string typed(1, byte);
    if (column < columns.size()) {
      columns[column] = overstrike(columns[column], typed);
    } else {
      columns.push_back(typed);
    }
    ++column;
    in_sequence = value >= 0xC0;
  }
  for (const std::string& shown : columns) out += shown;
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

std::string render_overstrikes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    const std::string_view line = text.substr(0, newline);
    if (line.find(kBackspace) == std::string_view::npos) {
      for (const char byte : line) {
        if (byte != kBell) out.push_back(byte);
      }
    } else {
      render_line(line, out);
    }
    if (newline == std::string_view::npos) break;
    out.push_back('\n');
    text.remove_prefix(newline + 1);
  }
  return out;
}

int32_t llmc_version_of(const TokenStream& tokens) {
  return tokens.bytes_per_token() == sizeof(uint16_t) ? kLlmcVersion : kLlmcWideVersion;
}

TokenData load_token_file(const fs::path& path) {
  std::error_code error;
  TESSERA_CHECK(fs::is_regular_file(path, error),
                "data: '{}' is not a readable file (--data takes a file or 'synthetic')", path.string());
  std::vector<char> bytes = read_bytes(path);
  TESSERA_CHECK(!bytes.empty(), "data: '{}' is empty", path.string());
  if (starts_with_llmc_magic(bytes)) return parse_llmc(bytes, path);
  return bytes_to_tokens(std::string_view(bytes.data(), bytes.size()),
                         fmt::format("{} (text, {} bytes)", path.string(), bytes.size()));
}

TokenFileSize token_size_of_file(const fs::path& path) {
  std::optional<checkpoint::ReadFile> file;
  try {
    file.emplace(path.string());
  } catch (const tessera::Error&) {
    return {};  // loading it will say why
  }
  const int64_t size = file->size();
  std::vector<char> header(static_cast<size_t>(std::min(size, llmc_header_bytes())));
  file->read_at(0, header.data(), static_cast<int64_t>(header.size()));
  if (!starts_with_llmc_magic(header)) {
    return {size, size * static_cast<int64_t>(sizeof(uint16_t))};  // text: a token a byte
  }
  int32_t version = 0;
  if (header.size() >= 2 * sizeof(int32_t)) std::memcpy(&version, header.data() + sizeof(int32_t), sizeof(version));
  const int64_t token_bytes = llmc_token_bytes(version);
  if (token_bytes == 0) return {};  // loading it will say why
  const int64_t tokens = std::max<int64_t>(0, (size - llmc_header_bytes()) / token_bytes);
  return {tokens, tokens * token_bytes};
}

TokenData load_text_files(const std::vector<fs::path>& files, const std::string& description) {
  std::vector<char> bytes;
  for (const auto& file : files) {
    std::vector<char> part = read_bytes(file);
    bytes.insert(bytes.end(), part.begin(), part.end());
  }
  TESSERA_CHECK(!bytes.empty(), "data: {} holds no text", description);
  return bytes_to_tokens(std::string_view(bytes.data(), bytes.size()),
                         fmt::format("{} (text, {} files, {} bytes)", description, files.size(), bytes.size()));
}

std::vector<fs::path> default_corpus_files(const CorpusLocations& locations) {
  std::vector<fs::path> files = plain_files_in(locations.fortunes, /*skip_dat=*/true);
  if (!files.empty()) return files;
  return plain_files_in(locations.licenses, /*skip_dat=*/false);
}

CorpusText read_text_file(const fs::path& path) {
  std::error_code error;
  TESSERA_CHECK(fs::is_regular_file(path, error), "data: '{}' is not a readable file", path.string());
  std::vector<char> bytes = read_bytes(path);
  TESSERA_CHECK(!bytes.empty(), "data: '{}' is empty", path.string());
  TESSERA_CHECK(!starts_with_llmc_magic(bytes), "data: '{}' is an llm.c token file: tokens already, not text",
                path.string());
  return {std::string(bytes.begin(), bytes.end()), fmt::format("{} (text, {} bytes)", path.string(), bytes.size())};
}

CorpusText read_default_corpus(const CorpusLocations& locations) {
  std::vector<fs::path> files = default_corpus_files(locations);
  TESSERA_CHECK(!files.empty(),
                "data: no default corpus: neither '{}' (Debian package fortunes) nor '{}' holds a file; "
                "run tools/setup.sh or pass --data PATH",
                locations.fortunes.string(), locations.licenses.string());
  std::string text;
  int64_t file_bytes = 0;
  for (const auto& file : files) {
    const std::vector<char> bytes = read_bytes(file);
    file_bytes += static_cast<int64_t>(bytes.size());
    text += render_overstrikes(std::string_view(bytes.data(), bytes.size()));
  }
  const std::string directory = files.front().parent_path().string();
  TESSERA_CHECK(!text.empty(), "data: {} holds no text", directory);
  const int64_t rendered_away = file_bytes - static_cast<int64_t>(text.size());
  const std::string rendering =
      rendered_away == 0 ? std::string()
                         : fmt::format("; {} bytes of backspace overstrikes and bells rendered away", rendered_away);
  std::string description =
      fmt::format("{} (text, {} files, {} bytes{})", directory, files.size(), text.size(), rendering);
  return {std::move(text), std::move(description)};
}

TokenData load_default_corpus(const CorpusLocations& locations) {
  CorpusText corpus = read_default_corpus(locations);
  return bytes_to_tokens(corpus.text, std::move(corpus.description));
}

int64_t default_corpus_token_count(const CorpusLocations& locations) {
  int64_t tokens = 0;
  for (const auto& file : default_corpus_files(locations)) {
    const std::vector<char> bytes = read_bytes(file);
    tokens += static_cast<int64_t>(render_overstrikes(std::string_view(bytes.data(), bytes.size())).size());
  }
  return tokens;
}

}  // namespace tessera::train
