// Byte tokens from text, and printable text from bytes.
#include "train/byte_text.h"

#include <fmt/format.h>

#include <charconv>

#include "tensor/error.h"
#include "train/tokenizer/utf8_decoder.h"

namespace tessera::train {

std::vector<uint32_t> text_to_byte_tokens(std::string_view text) {
  std::vector<uint32_t> tokens;
  tokens.reserve(text.size());
  for (const char c : text) tokens.push_back(static_cast<uint8_t>(c));
  return tokens;
}

std::string byte_tokens_to_bytes(std::span<const uint32_t> tokens) {
  std::string bytes;
  bytes.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    TESSERA_CHECK(tokens[i] < kByteVocab, "byte tokens: token {} at position {} is not a byte (>= {})", tokens[i], i,
                  kByteVocab);
    bytes.push_back(static_cast<char>(tokens[i]));
  }
  return bytes;
}

std::string bytes_to_printable(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size());
  for (size_t at = 0; at < bytes.size();) {
    const auto byte = static_cast<uint8_t>(bytes[at]);
    // A well-formed multi-byte sequence is printable unless a C1 control (U+0080..U+009F).
    const Utf8Char character = byte >= 0x80 ? decode_utf8_char(bytes, at) : Utf8Char{};
    if (byte == '\\') {
      text += "\\\\";
      ++at;
    } else if ((byte >= 0x20 && byte <= 0x7E) || byte == '\n' || byte == '\t') {
      text.push_back(static_cast<char>(byte));
      ++at;
    } else if (character.well_formed && character.code_point >= 0xA0) {
      text.append(bytes.substr(at, character.length));
      at += character.length;
    } else {
      text += fmt::format("\\x{:02x}", byte);
      ++at;
    }
  }
  return text;
}

std::string byte_tokens_to_printable(std::span<const uint32_t> tokens) {
  return bytes_to_printable(byte_tokens_to_bytes(tokens));
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

}  // namespace tessera::train
