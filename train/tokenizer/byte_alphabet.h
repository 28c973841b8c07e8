// GPT-2's byte alphabet: every byte as one printable Unicode character, so
// that byte-level BPE vocabularies and merges can be written as text. The 188
// bytes that are printable Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF)
// stand for themselves; the other 68 (controls, space, DEL, NBSP, soft
// hyphen...) take U+0100 onwards in byte order: the space 0x20 is 'Ġ'
// (U+0120), the newline 0x0A is 'Ċ' (U+010A). The bytes_to_unicode() table of
// GPT-2's encoder.py, which Hugging Face's ByteLevel pre-tokenizer and decoder use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::train {

// The character that stands for `byte`.
char32_t byte_to_alphabet(uint8_t byte);

// The byte `character` stands for; nullopt when it is not of the alphabet.
std::optional<uint8_t> alphabet_to_byte(char32_t character);

// `bytes` written in the alphabet, as UTF-8 ("a b\n" -> "aĠbĊ").
std::string bytes_to_alphabet_text(std::string_view bytes);

// The bytes a text of the alphabet stands for ("aĠbĊ" -> "a b\n"); nullopt
// when the text holds a character outside the alphabet or is not UTF-8.
std::optional<std::string> alphabet_text_to_bytes(std::string_view text);

// `code_point` as UTF-8, appended to `out`.
void append_utf8(char32_t code_point, std::string& out);

}  // namespace tessera::train
