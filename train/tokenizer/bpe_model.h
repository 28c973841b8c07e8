// Byte-level BPE: the vocabulary (each token's text in GPT-2's byte alphabet
// and its id), the merges in rank order, and the encoding of one word (a
// piece of the pre-tokenizer's split) as Hugging Face's BPE model encodes it:
// start from one token per byte, then repeatedly merge the adjacent pair of
// lowest merge rank (the leftmost of equal ones), through a min-heap of
// candidate pairs: O(n log n) for a word of n bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera::train {

// The largest token id a vocabulary may use (2^24 - 1: a real vocabulary has
// at most a few hundred thousand tokens).
inline constexpr uint32_t kMaxTokenId = (1u << 24) - 1;

// What a tokenizer's files say of its BPE model.
struct BpeSpec {
  std::vector<std::pair<std::string, uint32_t>> vocab;      // token text (byte alphabet) -> id
  std::vector<std::pair<std::string, std::string>> merges;  // rank r: the pair merged r-th
  // When the whole word is a token, it is that token, whatever the merges
  // would make of it (Llama 3's tokenizer.json sets this).
  bool ignore_merges = false;
  std::string source;  // the file the spec came from, for errors
};

// Heterogeneous lookup (std::string_view) into maps keyed by std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

class BpeModel {
 public:
  // Throws tessera::Error naming spec.source when two tokens share an id, a
  // byte has no token (a byte-level vocabulary must hold all 256), or a merge
  // names a token the vocabulary lacks (either part, or what they make).
  explicit BpeModel(const BpeSpec& spec);

  // Appends the ids of `word` (its bytes, not its alphabet text) to `ids`.
  void encode_word(std::string_view word, std::vector<uint32_t>& ids) const;

  // The largest id + 1.
  int64_t vocab_size() const { return static_cast<int64_t>(has_token_.size()); }
  size_t merge_count() const { return merges_.size(); }
  // The bytes of token `id`; nullopt for an id no token has (a gap in the
  // ids). A token whose text is not all of the byte alphabet (no encoding
  // makes one) stands for its text's own UTF-8 bytes.
  std::optional<std::string_view> token_bytes(uint32_t id) const;
  // The token whose bytes are exactly `bytes`, among those of the alphabet.
  std::optional<uint32_t> token_id(std::string_view bytes) const;

 private:
  struct Merge {
    uint32_t rank = 0;
    uint32_t merged_id = 0;
  };
  static uint64_t pair_key(uint32_t left, uint32_t right) { return (uint64_t{left} << 32) | right; }
  std::optional<Merge> find_merge(uint32_t left, uint32_t right) const;
  void merge_by_rank(std::string_view word, std::vector<uint32_t>& ids) const;

  // Token id's bytes: all_token_bytes_[token_offsets_[id], token_offsets_[id + 1]).
  std::string all_token_bytes_;
  std::vector<size_t> token_offsets_;
  std::vector<bool> has_token_;                                                         // by id: false for a gap
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> id_of_bytes_;  // byte-alphabet tokens
  std::array<uint32_t, 256> byte_ids_{};                                                // the token of each single byte
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and result
  bool ignore_merges_ = false;
};

}  // namespace tessera::train
