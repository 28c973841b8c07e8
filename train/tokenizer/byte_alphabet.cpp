// The byte alphabet's two tables, built once.
#include "train/tokenizer/byte_alphabet.h"

#include <array>

#include "train/tokenizer/utf8_decoder.h"

namespace tessera::train {

namespace {

bool stands_for_itself(uint32_t byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
}

// byte -> character; the characters are all below U+0144.
const std::array<char32_t, 256> kAlphabet = [] {
  std::array<char32_t, 256> alphabet{};
  char32_t next_free = 0x100;
  for (uint32_t byte = 0; byte < 256; ++byte) alphabet[byte] = stands_for_itself(byte) ? byte : next_free++;
  return alphabet;
}();

constexpr char32_t kAlphabetEnd = 0x100 + 68;
constexpr int16_t kNotInAlphabet = -1;

// character -> byte, for characters below kAlphabetEnd.
const std::array<int16_t, kAlphabetEnd> kBytes = [] {
  std::array<int16_t, kAlphabetEnd> bytes{};
  bytes.fill(kNotInAlphabet);
  for (int16_t byte = 0; byte < 256; ++byte) bytes[kAlphabet[static_cast<size_t>(byte)]] = byte;
  return bytes;
}();

}  // namespace

char32_t byte_to_alphabet(uint8_t byte) { return kAlphabet[byte]; }

std::optional<uint8_t> alphabet_to_byte(char32_t character) {
  if (character >= kAlphabetEnd || kBytes[character] == kNotInAlphabet) return std::nullopt;
  return static_cast<uint8_t>(kBytes[character]);
}

void append_utf8(char32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

std::string bytes_to_alphabet_text(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const char byte : bytes) append_utf8(kAlphabet[static_cast<uint8_t>(byte)], text);
  return text;
}

std::optional<std::string> alphabet_text_to_bytes(std::string_view text) {
  std::string bytes;
  bytes.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const Utf8Char character = decode_utf8_char(text, at);
    if (!character.well_formed) return std::nullopt;
    const std::optional<uint8_t> byte = alphabet_to_byte(character.code_point);
    if (!byte) return std::nullopt;
    bytes.push_back(static_cast<char>(*byte));
    at += character.length;
  }
  return bytes;
}

}  // namespace tessera::train
