// Lossy UTF-8 decoding by maximal subparts.
#include "train/tokenizer/utf8_decoder.h"

namespace tessera::train {

namespace {

bool is_continuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// What a lead byte promises: the sequence's length and the range its second
// byte must fall in (Table 3-7 of the Unicode Standard). Length 0: no lead.
struct Lead {
  uint32_t length = 0;
  uint8_t second_min = 0x80, second_max = 0xBF;
  char32_t bits = 0;  // the lead's payload bits
};

Lead read_lead(uint8_t lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return {2, 0x80, 0xBF, lead & 0x1Fu};
  if (lead == 0xE0) return {3, 0xA0, 0xBF, lead & 0x0Fu};
  if (lead == 0xED) return {3, 0x80, 0x9F, lead & 0x0Fu};  // no surrogates
  if (lead >= 0xE1 && lead <= 0xEF) return {3, 0x80, 0xBF, lead & 0x0Fu};
  if (lead == 0xF0) return {4, 0x90, 0xBF, lead & 0x07u};
  if (lead >= 0xF1 && lead <= 0xF3) return {4, 0x80, 0xBF, lead & 0x07u};
  if (lead == 0xF4) return {4, 0x80, 0x8F, lead & 0x07u};  // nothing above U+10FFFF
  return {};                                               // 0x80..0xC1 (continuations, overlong leads), 0xF5..0xFF
}

}  // namespace

Utf8Char decode_utf8_char(std::string_view text, size_t at) {
  if (at >= text.size()) return {};
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t first = byte(at);
  if (first < 0x80) return {first, 1, true};
  const Lead lead = read_lead(first);
  const Utf8Char ill_formed_of_one{kReplacementCharacter, 1, false};
  if (lead.length == 0 || at + 1 >= text.size()) return ill_formed_of_one;
  if (byte(at + 1) < lead.second_min || byte(at + 1) > lead.second_max) return ill_formed_of_one;
  char32_t code_point = (lead.bits << 6) | (byte(at + 1) & 0x3Fu);
  for (uint32_t i = 2; i < lead.length; ++i) {
    if (at + i >= text.size() || !is_continuation(byte(at + i))) return {kReplacementCharacter, i, false};
    code_point = (code_point << 6) | (byte(at + i) & 0x3Fu);
  }
  return {code_point, lead.length, true};
}

}  // namespace tessera::train
