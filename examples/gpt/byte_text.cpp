// Byte tokens from text, and printable text from byte tokens.
#include "examples/gpt/byte_text.h"

#include <fmt/format.h>

#include <charconv>

#include "tensor/error.h"

namespace gpt {

namespace {

bool is_continuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// The length of the well-formed, printable UTF-8 sequence starting at
// bytes[at] (2 to 4), or 0 when there is none there (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF; C1 controls U+0080..U+009F
// count as unprintable).
size_t utf8_sequence_length(const std::vector<uint8_t>& bytes, size_t at) {
  const uint8_t lead = bytes[at];
  size_t length = 0;
  uint8_t second_min = 0x80, second_max = 0xBF;
  if (lead == 0xC2) {
    length = 2, second_min = 0xA0;
  } else if (lead >= 0xC3 && lead <= 0xDF) {
    length = 2;
  } else if (lead == 0xE0) {
    length = 3, second_min = 0xA0;
  } else if (lead == 0xED) {
    length = 3, second_max = 0x9F;
  } else if (lead >= 0xE1 && lead <= 0xEF) {
    length = 3;
  } else if (lead == 0xF0) {
    length = 4, second_min = 0x90;
  } else if (lead >= 0xF1 && lead <= 0xF3) {
    length = 4;
  } else if (lead == 0xF4) {
    length = 4, second_max = 0x8F;
  } else {
    return 0;
  }
  if (at + length > bytes.size()) return 0;
  if (bytes[at + 1] < second_min || bytes[at + 1] > second_max) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (!is_continuation(bytes[at + i])) return 0;
  }
  return length;
}

}  // namespace

std::vector<uint16_t> text_to_byte_tokens(std::string_view text) {
  std::vector<uint16_t> tokens;
  tokens.reserve(text.size());
  for (const char c : text) tokens.push_back(static_cast<uint8_t>(c));
  return tokens;
}

std::string byte_tokens_to_bytes(std::span<const uint16_t> tokens) {
  std::string bytes;
  bytes.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    TESSERA_CHECK(tokens[i] < kByteVocab, "byte tokens: token {} at position {} is not a byte (>= {})", tokens[i], i,
                  kByteVocab);
    bytes.push_back(static_cast<char>(tokens[i]));
  }
  return bytes;
}

std::string byte_tokens_to_printable(std::span<const uint16_t> tokens) {
  const std::string raw = byte_tokens_to_bytes(tokens);
  const std::vector<uint8_t> bytes(raw.begin(), raw.end());
  std::string text;
  text.reserve(bytes.size());
  for (size_t at = 0; at < bytes.size();) {
    const uint8_t byte = bytes[at];
    if (byte == '\\') {
      text += "\\\\";
      ++at;
    } else if ((byte >= 0x20 && byte <= 0x7E) || byte == '\n' || byte == '\t') {
      text.push_back(static_cast<char>(byte));
      ++at;
    } else if (const size_t length = byte >= 0x80 ? utf8_sequence_length(bytes, at) : 0; length > 0) {
      text.append(reinterpret_cast<const char*>(bytes.data() + at), length);
      at += length;
    } else {
      text += fmt::format("\\x{:02x}", byte);
      ++at;
    }
  }
  return text;
}

std::string printable_to_bytes(std::string_view printable) {
  std::string bytes;
  bytes.reserve(printable.size());
  for (size_t at = 0; at < printable.size(); ++at) {
    if (printable[at] != '\\') {
      bytes.push_back(printable[at]);
      continue;
    }
    if (at + 1 < printable.size() && printable[at + 1] == '\\') {
      bytes.push_back('\\');
      ++at;
      continue;
    }
    unsigned value = 0;
    const bool escape = at + 3 < printable.size() && printable[at + 1] == 'x' &&
                        std::from_chars(&printable[at + 2], &printable[at + 2] + 2, value, 16).ptr ==
                            &printable[at + 2] + 2;
    TESSERA_CHECK(escape, "printable text: the backslash at position {} starts neither \\\\ nor \\xHH", at);
    bytes.push_back(static_cast<char>(value));
    at += 3;
  }
  return bytes;
}

}  // namespace gpt
