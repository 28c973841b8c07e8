// tokenizer.json: each section read, or refused by its key.
#include "train/tokenizer/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include "checkpoint/checksum.h"
#include "tensor/error.h"
#include "train/tokenizer/gpt2_vocab_files.h"

namespace tessera::train {

namespace {

using nlohmann::json;

// Errors name the file and the key's path ("tokenizer.json: model.type").
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void refuse(const std::string& key, const std::string& what) const {
    tessera::fail("{}: {}: {}", source_, key, what);
  }
  const json& member(const json& object, const std::string& key, const std::string& path) const {
    const auto found = object.find(key);
    if (found == object.end()) refuse(path, "missing");
    return *found;
  }
  // The member, or null when absent.
  const json& optional_member(const json& object, const std::string& key) const {
    static const json kNull;
    const auto found = object.find(key);
    return found == object.end() ? kNull : *found;
  }
  const json& object_at(const json& object, const std::string& key, const std::string& path) const {
    const json& value = member(object, key, path);
    if (!value.is_object()) refuse(path, fmt::format("expected an object, got {}", value.type_name()));
    return value;
  }
  std::string string_at(const json& object, const std::string& key, const std::string& path) const {
    const json& value = member(object, key, path);
    if (!value.is_string()) refuse(path, fmt::format("expected a string, got {}", value.dump()));
    return value.get<std::string>();
  }
  // A boolean member; `fallback` when absent or null.
  bool flag_at(const json& object, const std::string& key, const std::string& path, bool fallback) const {
    const json& value = optional_member(object, key);
    if (value.is_null()) return fallback;
    if (!value.is_boolean()) refuse(path, fmt::format("expected true or false, got {}", value.dump()));
    return value.get<bool>();
  }
  // A member that must be absent, null, or `allowed` (when given).
  void require_unset(const json& object, const std::string& key, const std::string& path, const std::string& why,
                     const json& allowed = json()) const {
    const json& value = optional_member(object, key);
    if (value.is_null() || (!allowed.is_null() && value == allowed)) return;
    refuse(path, fmt::format("{} is not implemented ({})", value.dump(), why));
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

void read_model(const Reader& reader, const json& model, TokenizerSpec& spec) {
  const std::string type = model.contains("type") ? reader.string_at(model, "type", "model.type") : "BPE";
  if (type != "BPE") reader.refuse("model.type", fmt::format("'{}': only BPE models are implemented", type));
  reader.require_unset(model, "dropout", "model.dropout", "encoding is deterministic");
  reader.require_unset(model, "continuing_subword_prefix", "model.continuing_subword_prefix",
                       "byte-level BPE marks no subwords", "");
  reader.require_unset(model, "end_of_word_suffix", "model.end_of_word_suffix", "byte-level BPE marks no word ends",
                       "");
  if (reader.flag_at(model, "byte_fallback", "model.byte_fallback", false)) {
    reader.refuse("model.byte_fallback", "true is not implemented (a byte-level vocabulary has every byte already)");
  }
  spec.bpe.ignore_merges = reader.flag_at(model, "ignore_merges", "model.ignore_merges", false);
  spec.bpe.vocab = vocab_from_json(reader.object_at(model, "vocab", "model.vocab"), reader.source() + ": model.vocab");
  const json& merges = reader.member(model, "merges", "model.merges");
  if (!merges.is_array()) reader.refuse("model.merges", fmt::format("expected an array, got {}", merges.type_name()));
  spec.bpe.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    const std::string key = fmt::format("model.merges[{}]", i);
    if (merge.is_string()) {
      const auto pair = split_merge(merge.get<std::string>());
      if (!pair) reader.refuse(key, fmt::format("{} is not two tokens separated by one space", merge.dump()));
      spec.bpe.merges.push_back(*pair);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      spec.bpe.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      reader.refuse(key, fmt::format("expected \"a b\" or [\"a\", \"b\"], got {}", merge.dump()));
    }
  }
}

// ByteLevel: its GPT-2 regex split when use_regex (the default).
void read_byte_level(const Reader& reader, const json& byte_level, const std::string& path, TokenizerSpec& spec) {
  if (reader.flag_at(byte_level, "add_prefix_space", path + ".add_prefix_space", false)) {
    reader.refuse(path + ".add_prefix_space",
                  "true is not implemented (a space added before the text would make decode no inverse of encode)");
  }
  if (reader.flag_at(byte_level, "use_regex", path + ".use_regex", true)) spec.splits.push_back(SplitPattern::gpt2);
}

void read_split(const Reader& reader, const json& split, const std::string& path, TokenizerSpec& spec) {
  const json& pattern = reader.object_at(split, "pattern", path + ".pattern");
  if (!pattern.contains("Regex")) {
    reader.refuse(path + ".pattern", fmt::format("{}: only a Regex pattern is implemented", pattern.dump()));
  }
  const std::string regex = reader.string_at(pattern, "Regex", path + ".pattern.Regex");
  const std::optional<SplitPattern> known = split_pattern_from_regex(regex);
  if (!known) {
    reader.refuse(
        path + ".pattern.Regex",
        fmt::format("'{}' is not implemented; the regexes implemented are GPT-2's '{}' and Llama 3's '{}'", regex,
                    split_pattern_regex(SplitPattern::gpt2), split_pattern_regex(SplitPattern::llama3)));
  }
  const std::string behavior = reader.string_at(split, "behavior", path + ".behavior");
  if (behavior != "Isolated") {
    reader.refuse(path + ".behavior", fmt::format("'{}': only Isolated is implemented", behavior));
  }
  if (reader.flag_at(split, "invert", path + ".invert", false)) {
    reader.refuse(path + ".invert", "true is not implemented");
  }
  spec.splits.push_back(*known);
}

// ByteLevel, or a Sequence of Splits ending in ByteLevel.
void read_pre_tokenizer(const Reader& reader, const json& root, TokenizerSpec& spec) {
  const json& pre_tokenizer = reader.optional_member(root, "pre_tokenizer");
  if (pre_tokenizer.is_null()) {
    reader.refuse("pre_tokenizer", "null: a byte-level BPE needs the ByteLevel pre-tokenizer");
  }
  if (!pre_tokenizer.is_object()) reader.refuse("pre_tokenizer", "expected an object");
  const std::string type = reader.string_at(pre_tokenizer, "type", "pre_tokenizer.type");
  if (type == "ByteLevel") return read_byte_level(reader, pre_tokenizer, "pre_tokenizer", spec);
  if (type != "Sequence") {
    reader.refuse("pre_tokenizer.type", fmt::format("'{}' is not implemented (ByteLevel, or a Sequence of Split and "
                                                    "ByteLevel)",
                                                    type));
  }
  const json& steps = reader.member(pre_tokenizer, "pretokenizers", "pre_tokenizer.pretokenizers");
  if (!steps.is_array() || steps.empty()) reader.refuse("pre_tokenizer.pretokenizers", "expected a non-empty array");
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string path = fmt::format("pre_tokenizer.pretokenizers[{}]", i);
    if (!steps[i].is_object()) reader.refuse(path, "expected an object");
    const std::string step_type = reader.string_at(steps[i], "type", path + ".type");
    const bool last = i + 1 == steps.size();
    if (step_type == "Split" && !last) {
      read_split(reader, steps[i], path, spec);
    } else if (step_type == "ByteLevel" && last) {
      read_byte_level(reader, steps[i], path, spec);
    } else {
      reader.refuse(path + ".type",
                    fmt::format("'{}' here is not implemented (Splits, then ByteLevel last)", step_type));
    }
  }
}

void read_added_tokens(const Reader& reader, const json& root, TokenizerSpec& spec) {
  const json& added = reader.optional_member(root, "added_tokens");
  if (added.is_null()) return;
  if (!added.is_array()) reader.refuse("added_tokens", "expected an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string path = fmt::format("added_tokens[{}]", i);
    const json& token = added[i];
    if (!token.is_object()) reader.refuse(path, "expected an object");
    const json& id = reader.member(token, "id", path + ".id");
    if (!id.is_number_unsigned() || id.get<uint64_t>() > kMaxTokenId) {
      reader.refuse(path + ".id", fmt::format("expected an integer in [0, {}], got {}", kMaxTokenId, id.dump()));
    }
    AddedToken entry;
    entry.id = id.get<uint32_t>();
    entry.content = reader.string_at(token, "content", path + ".content");
    if (entry.content.empty()) reader.refuse(path + ".content", "empty");
    entry.special = reader.flag_at(token, "special", path + ".special", false);
    entry.normalized = reader.flag_at(token, "normalized", path + ".normalized", !entry.special);
    for (const char* option : {"single_word", "lstrip", "rstrip"}) {
      if (reader.flag_at(token, option, path + "." + option, false)) {
        reader.refuse(path + "." + option, "true is not implemented");
      }
    }
    spec.added_tokens.push_back(std::move(entry));
  }
}

}  // namespace

TokenizerSpec read_tokenizer_json(std::string_view text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& error) {
    tessera::fail("{}: not valid JSON: {}", source, error.what());
  }
  const Reader reader(source);
  if (!root.is_object()) reader.refuse("(top level)", "expected an object");
  TokenizerSpec spec;
  spec.source = source;
  spec.bpe.source = source;
  spec.content_crc32c = tessera::checkpoint::crc32c(text.data(), text.size());
  try {
    read_model(reader, reader.object_at(root, "model", "model"), spec);
    reader.require_unset(root, "normalizer", "normalizer", "no normalizer is implemented");
    reader.require_unset(root, "truncation", "truncation", "encode keeps every token");
    reader.require_unset(root, "padding", "padding", "encode adds no tokens");
    read_pre_tokenizer(reader, root, spec);
    const json& decoder = reader.optional_member(root, "decoder");
    if (!decoder.is_object() || !decoder.contains("type") || decoder["type"] != "ByteLevel") {
      reader.refuse("decoder", fmt::format("{}: only the ByteLevel decoder is implemented", decoder.dump()));
    }
    read_added_tokens(reader, root, spec);
  } catch (const json::exception& error) {
    tessera::fail("{}: {}", source, error.what());
  }
  return spec;
}

}  // namespace tessera::train
