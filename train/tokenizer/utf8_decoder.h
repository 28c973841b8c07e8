// UTF-8 decoding the way Python's and Rust's lossy decoders see text: a
// well-formed sequence (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF) is its code point, and each maximal subpart of an
// ill-formed one (the Unicode Standard, 3.9, "U+FFFD substitution of maximal
// subparts") is one U+FFFD that spans its bytes. The tokenizer's regexes run
// on what this decoder sees; its byte-level BPE keeps the bytes themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::train {

inline constexpr char32_t kReplacementCharacter = 0xFFFD;

struct Utf8Char {
  char32_t code_point = 0;  // U+FFFD for an ill-formed subpart
  uint32_t length = 0;      // bytes it spans (1 to 4); 0 at the end of the text
  bool well_formed = false;
};

// The character that starts at byte `at` of `text` (length 0 when at >= size).
Utf8Char decode_utf8_char(std::string_view text, size_t at);

}  // namespace tessera::train
