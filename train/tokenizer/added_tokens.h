// Added tokens (Hugging Face's `added_tokens`: special tokens such as
// <|endoftext|>, and tokens added to a vocabulary after training): found in
// the text before the pre-tokenizer runs, each occurrence one id, and the
// text between them split and encoded as usual. Matching is Hugging Face's:
// leftmost-longest, the tokens with normalized = false first over the whole
// text, then those with normalized = true over what is left between them
// (with no normalizer, both see the text as it is).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::train {

struct AddedToken {
  std::string content;  // its bytes in the text (UTF-8 of tokenizer.json's "content")
  uint32_t id = 0;
  bool normalized = false;
  bool special = false;
};

// A stretch of text: an added token's occurrence, or the text between them.
struct TextSegment {
  static constexpr uint32_t kText = UINT32_MAX;
  size_t begin = 0;
  size_t end = 0;
  uint32_t token = kText;  // the added token's id, or kText
};

class AddedTokens {
 public:
  AddedTokens() = default;
  // Throws tessera::Error for a token with empty content.
  explicit AddedTokens(std::vector<AddedToken> tokens);

  // `text` cut at the added tokens' occurrences, in order; replaces `segments`.
  void split(std::string_view text, std::vector<TextSegment>& segments) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  // The tokens of one matching pass (indices into tokens_), grouped by their
  // first byte, longest first.
  struct Pass {
    std::array<std::vector<size_t>, 256> by_first_byte;
    bool empty = true;
  };
  void build_pass(Pass& pass, bool normalized) const;
  // Appends the segments of text[begin, end) under `pass`.
  void split_range(std::string_view text, size_t begin, size_t end, const Pass& pass,
                   std::vector<TextSegment>& segments) const;

  std::vector<AddedToken> tokens_;
  Pass raw_pass_;         // normalized = false
  Pass normalized_pass_;  // normalized = true
};

}  // namespace tessera::train
