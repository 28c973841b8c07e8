// Loading a tokenizer's files; encode through added tokens, splits and the
// word cache; decode through one table of every id's bytes.
#include "train/tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "checkpoint/file_io.h"
#include "tensor/error.h"
#include "train/tokenizer/gpt2_vocab_files.h"
#include "train/tokenizer/tokenizer_json.h"

namespace tessera::train {

namespace fs = std::filesystem;

Tokenizer::Tokenizer(const TokenizerSpec& spec)
    : model_(spec.bpe),
      added_(spec.added_tokens),
      splits_(spec.splits),
      source_(spec.source),
      content_crc32c_(spec.content_crc32c) {
  std::map<uint32_t, const AddedToken*> added_by_id;
  vocab_size_ = model_.vocab_size();
  for (const AddedToken& token : added_.tokens()) {
    const auto [entry, fresh] = added_by_id.emplace(token.id, &token);
    TESSERA_CHECK(fresh || entry->second->content == token.content, "{}: added tokens '{}' and '{}' both have id {}",
                  source_, entry->second->content, token.content, token.id);
    vocab_size_ = std::max(vocab_size_, int64_t{token.id} + 1);
  }
  decode_offsets_.reserve(static_cast<size_t>(vocab_size_) + 1);
  has_id_.resize(static_cast<size_t>(vocab_size_));
  for (uint32_t id = 0; id < static_cast<uint32_t>(vocab_size_); ++id) {
    decode_offsets_.push_back(decode_bytes_.size());
    if (const auto added = added_by_id.find(id); added != added_by_id.end()) {
      decode_bytes_ += added->second->content;
      has_id_[id] = true;
    } else if (const std::optional<std::string_view> bytes = model_.token_bytes(id)) {
      decode_bytes_ += *bytes;
      has_id_[id] = true;
    }
  }
  decode_offsets_.push_back(decode_bytes_.size());
}

Tokenizer Tokenizer::load(const fs::path& path) {
  std::error_code error;
  const auto read = [](const fs::path& file) { return tessera::checkpoint::read_file_text(file.string()); };
  const auto pair = [&](const fs::path& vocab, const fs::path& merges) {
    TESSERA_CHECK(fs::is_regular_file(merges, error), "tokenizer {}: {} needs {} beside it, which is not a file",
                  path.string(), vocab.filename().string(), merges.string());
    return Tokenizer(read_gpt2_vocab_files(read(vocab), vocab.string(), read(merges), merges.string()));
  };
  if (fs::is_directory(path, error)) {
    if (fs::is_regular_file(path / "tokenizer.json", error)) {
      return Tokenizer(read_tokenizer_json(read(path / "tokenizer.json"), (path / "tokenizer.json").string()));
    }
    for (const char* name : {"vocab.json", "encoder.json"}) {
      if (fs::is_regular_file(path / name, error)) return pair(path / name, path / "merges.txt");
    }
    tessera::fail(
        "tokenizer {}: the directory holds neither tokenizer.json nor vocab.json (or encoder.json) with "
        "merges.txt",
        path.string());
  }
  TESSERA_CHECK(fs::is_regular_file(path, error),
                "tokenizer {}: not a file or directory (expected tokenizer.json, vocab.json or encoder.json, or a "
                "directory holding them)",
                path.string());
  const std::string name = path.filename().string();
  if (name == "vocab.json" || name == "encoder.json") return pair(path, path.parent_path() / "merges.txt");
  return Tokenizer(read_tokenizer_json(read(path), path.string()));
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3);
  encode(text, ids);
  return ids;
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& ids) {
  if (added_.empty()) return encode_words(text, 0, ids);
  added_.split(text, segments_);
  for (const TextSegment& segment : segments_) {
    if (segment.token != TextSegment::kText) {
      ids.push_back(segment.token);
    } else {
      encode_words(text.substr(segment.begin, segment.end - segment.begin), 0, ids);
    }
  }
}

void Tokenizer::encode_words(std::string_view text, size_t stage, std::vector<uint32_t>& ids) {
  if (stage == splits_.size()) return cache_.encode(model_, text, ids);
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = split_piece_end(text, splits_[stage], begin);
    encode_words(text.substr(begin, end - begin), stage + 1, ids);
    begin = end;
  }
}

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    TESSERA_CHECK(id < static_cast<uint64_t>(vocab_size_),
                  "decode: id {} at position {} is out of range: {}'s ids are below {}", id, i, source_, vocab_size_);
    TESSERA_CHECK(has_id_[id], "decode: id {} at position {} names no token of {} (its ids have gaps)", id, i, source_);
    bytes.append(decode_bytes_, decode_offsets_[id], decode_offsets_[id + 1] - decode_offsets_[id]);
  }
  return bytes;
}

std::string Tokenizer::describe() const {
  std::vector<std::string_view> names;
  for (const SplitPattern split : splits_) names.push_back(split_pattern_name(split));
  return fmt::format("{}: byte-level BPE, {} ids, {} merges, split {}, {} added token{}", source_, vocab_size_,
                     model_.merge_count(),
                     names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, " then ")),
                     added_.tokens().size(), added_.tokens().size() == 1 ? "" : "s");
}

}  // namespace tessera::train
