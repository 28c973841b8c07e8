// encoder.json/vocab.json and merges.txt.
#include "train/tokenizer/gpt2_vocab_files.h"

#include "checkpoint/checksum.h"
#include "tensor/error.h"

namespace tessera::train {

std::vector<std::pair<std::string, uint32_t>> vocab_from_json(const nlohmann::json& vocab, const std::string& where) {
  TESSERA_CHECK(vocab.is_object(), "{}: expected an object of token -> id, got {}", where, vocab.type_name());
  std::vector<std::pair<std::string, uint32_t>> entries;
  entries.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    TESSERA_CHECK(id.is_number_unsigned() && id.get<uint64_t>() <= kMaxTokenId,
                  "{}: the id of '{}' must be an integer in [0, {}], got {}", where, token, kMaxTokenId, id.dump());
    entries.emplace_back(token, id.get<uint32_t>());
  }
  return entries;
}

std::optional<std::pair<std::string, std::string>> split_merge(std::string_view text) {
  const size_t space = text.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 == text.size() ||
      text.find(' ', space + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  return std::pair{std::string(text.substr(0, space)), std::string(text.substr(space + 1))};
}

TokenizerSpec read_gpt2_vocab_files(std::string_view vocab_json, const std::string& vocab_source,
                                    std::string_view merges_txt, const std::string& merges_source) {
  TokenizerSpec spec;
  spec.source = vocab_source + " + " + merges_source;
  spec.splits = {SplitPattern::gpt2};
  spec.bpe.source = spec.source;
  spec.content_crc32c = tessera::checkpoint::crc32c(vocab_json.data(), vocab_json.size());
  spec.content_crc32c = tessera::checkpoint::crc32c(merges_txt.data(), merges_txt.size(), spec.content_crc32c);
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_json);
  } catch (const nlohmann::json::parse_error& error) {
    tessera::fail("{}: not valid JSON: {}", vocab_source, error.what());
  }
  spec.bpe.vocab = vocab_from_json(vocab, vocab_source);
  size_t line_number = 0;
  for (size_t at = 0; at < merges_txt.size();) {
    size_t end = merges_txt.find('\n', at);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(at, end - at);
    at = end + 1;
    ++line_number;
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.starts_with("#version")) continue;
    const auto merge = split_merge(line);
    TESSERA_CHECK(merge.has_value(), "{}: line {} is not a merge of two tokens separated by one space: '{}'",
                  merges_source, line_number, line);
    spec.bpe.merges.push_back(*merge);
  }
  return spec;
}

}  // namespace tessera::train
