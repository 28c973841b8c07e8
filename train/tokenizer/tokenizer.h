// A byte-level BPE tokenizer, written here: GPT-2's encoder.json/vocab.json +
// merges.txt, or a Hugging Face tokenizer.json of a BPE model (GPT-2 and
// Llama 3 style). encode(text) gives the ids Hugging Face's
// encode(text, add_special_tokens=False) gives, for any bytes: the added
// tokens are cut out first, each stretch between them is split by the
// pre-tokenizer's regexes (split_pattern.h, on the text as a lossy UTF-8
// decoder sees it) and each piece's bytes are merged by rank (bpe_model.h,
// through a word cache). decode(ids) gives back the bytes, exactly: for every
// byte string s, decode(encode(s)) == s, ill-formed UTF-8 included.
//
//   train::Tokenizer tokenizer = train::Tokenizer::load("tokenizer.json");
//   std::vector<uint32_t> ids = tokenizer.encode("Hello world");
//   std::string text = tokenizer.decode(ids);
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "train/tokenizer/added_tokens.h"
#include "train/tokenizer/bpe_model.h"
#include "train/tokenizer/split_pattern.h"
#include "train/tokenizer/tokenizer_spec.h"
#include "train/tokenizer/word_cache.h"

namespace tessera::train {

class Tokenizer {
 public:
  // Throws tessera::Error naming spec.source when the model is inconsistent
  // (bpe_model.h) or an added token's id clashes with another's.
  explicit Tokenizer(const TokenizerSpec& spec);

  // `path`: a tokenizer.json file; or a directory holding tokenizer.json, or
  // else vocab.json (or encoder.json) and merges.txt. Throws tessera::Error
  // naming the path and what is wrong with it.
  static Tokenizer load(const std::filesystem::path& path);

  // The ids of `text` (any bytes). Not thread-safe: the word cache changes;
  // use one Tokenizer per thread.
  std::vector<uint32_t> encode(std::string_view text);
  // The same, appended to `ids`.
  void encode(std::string_view text, std::vector<uint32_t>& ids);

  // The bytes of `ids`. Throws tessera::Error naming the position of an id
  // >= vocab_size() or one no token has.
  std::string decode(std::span<const uint32_t> ids) const;

  // The largest id + 1 (the BPE model's and the added tokens').
  int64_t vocab_size() const { return vocab_size_; }
  // What was read ("tokenizer.json", "vocab.json + merges.txt"), and how.
  const std::string& source() const { return source_; }
  std::string describe() const;
  // CRC-32C of the files' bytes: two tokenizers with equal files have equal hashes.
  uint32_t content_crc32c() const { return content_crc32c_; }
  const std::vector<SplitPattern>& splits() const { return splits_; }
  size_t cached_words() const { return cache_.size(); }

 private:
  // Splits `text` by splits_[stage] and what follows; a piece past the last stage is a word.
  void encode_words(std::string_view text, size_t stage, std::vector<uint32_t>& ids);

  BpeModel model_;
  AddedTokens added_;
  std::vector<SplitPattern> splits_;
  // What decode writes for id: decode_bytes_[decode_offsets_[id], decode_offsets_[id + 1]),
  // an added token's content or else the model's token; nothing for an id no token has.
  std::string decode_bytes_;
  std::vector<size_t> decode_offsets_;
  std::vector<bool> has_id_;
  std::string source_;
  uint32_t content_crc32c_ = 0;
  int64_t vocab_size_ = 0;
  WordCache cache_;
  std::vector<TextSegment> segments_;  // scratch of encode
};

}  // namespace tessera::train
