// The two scanners. Each finds the end of the match that starts at byte i,
// trying the regex's alternatives in order; `next` is the character after
// the current one (length 0 at the end of the text).
#include "train/tokenizer/split_pattern.h"

#include "train/tokenizer/unicode_class.h"
#include "train/tokenizer/utf8_decoder.h"

namespace tessera::train {

namespace {

constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A decoded character with its class; length 0 past the end of the text.
struct Char {
  char32_t code_point = 0;
  uint32_t length = 0;
  CharClass cls = CharClass::other;
};

Char char_at(std::string_view text, size_t at) {
  if (at < text.size() && static_cast<uint8_t>(text[at]) < 0x80) {
    const char32_t ascii = static_cast<uint8_t>(text[at]);
    return {ascii, 1, char_class(ascii)};
  }
  const Utf8Char decoded = decode_utf8_char(text, at);
  if (decoded.length == 0) return {};
  return {decoded.code_point, decoded.length, char_class(decoded.code_point)};
}

bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }

// The end of the run of characters of class `cls` that starts at `at`.
size_t class_run_end(std::string_view text, size_t at, CharClass cls) {
  for (Char c = char_at(text, at); c.length > 0 && c.cls == cls; c = char_at(text, at)) at += c.length;
  return at;
}

// A letter as a contraction's letters see it: ASCII letters and, under
// (?i), their case-folded forms (Unicode's simple case folding maps only
// 'ſ' U+017F besides the capitals onto s, t, r, e, v, m, l or d).
char32_t contraction_letter(char32_t c, bool ignore_case) {
  if (!ignore_case) return c;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 'a';
  if (c == 0x017F) return 's';
  return c;
}

// `'s|'t|'re|'ve|'m|'ll|'d` (case-folded under ignore_case): the end of the
// contraction at `at`, or 0 when none starts there.
size_t contraction_end(std::string_view text, size_t at, bool ignore_case) {
  if (text[at] != '\'') return 0;
  const Char first = char_at(text, at + 1);
  const char32_t a = contraction_letter(first.code_point, ignore_case);
  if (first.length == 0) return 0;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return at + 1 + first.length;
  const Char second = char_at(text, at + 1 + first.length);
  const char32_t b = contraction_letter(second.code_point, ignore_case);
  if (second.length == 0) return 0;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
    return at + 1 + first.length + second.length;
  }
  return 0;
}

// `\s+(?!\S)|\s+` at a whitespace character: the whole run when it reaches
// the end of the text; else the run but its last character, which then
// starts the next piece (a space before a word joins the word); a single
// whitespace character before a non-space is a piece of its own.
size_t whitespace_end(std::string_view text, size_t at) {
  size_t last_start = at;
  size_t end = at;
  for (Char c = char_at(text, end); c.length > 0 && c.cls == CharClass::space; c = char_at(text, end)) {
    last_start = end;
    end += c.length;
  }
  if (end == text.size() || last_start == at) return end;
  return last_start;
}

size_t gpt2_piece_end(std::string_view text, size_t at) {
  if (const size_t end = contraction_end(text, at, /*ignore_case=*/false)) return end;
  const Char c = char_at(text, at);
  const Char next = char_at(text, at + c.length);
  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: a space joins the run after it.
  if (c.code_point == ' ' && next.length > 0 && next.cls != CharClass::space) {
    return class_run_end(text, at + 1, next.cls);
  }
  if (c.cls != CharClass::space) return class_run_end(text, at, c.cls);
  return whitespace_end(text, at);
}

size_t llama3_piece_end(std::string_view text, size_t at) {
  if (const size_t end = contraction_end(text, at, /*ignore_case=*/true)) return end;
  const Char c = char_at(text, at);
  const Char next = char_at(text, at + c.length);
  // `[^\r\n\p{L}\p{N}]?\p{L}+`: letters, after at most one character that is
  // no newline, letter or number.
  if (c.cls == CharClass::letter) return class_run_end(text, at, CharClass::letter);
  if (c.cls != CharClass::number && !is_newline(c.code_point) && next.length > 0 && next.cls == CharClass::letter) {
    return class_run_end(text, at + c.length, CharClass::letter);
  }
  // `\p{N}{1,3}`
  if (c.cls == CharClass::number) {
    size_t end = at;
    for (int count = 0; count < 3; ++count) {
      const Char digit = char_at(text, end);
      if (digit.length == 0 || digit.cls != CharClass::number) break;
      end += digit.length;
    }
    return end;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const bool spaced_other = c.code_point == ' ' && next.length > 0 && next.cls == CharClass::other;
  if (spaced_other || c.cls == CharClass::other) {
    size_t end = class_run_end(text, spaced_other ? at + 1 : at, CharClass::other);
    while (end < text.size() && is_newline(static_cast<uint8_t>(text[end]))) ++end;
    return end;
  }
  // `\s*[\r\n]+`: whitespace through its last newline.
  size_t newline_end = 0;
  for (size_t end = at; end < text.size();) {
    const Char space = char_at(text, end);
    if (space.cls != CharClass::space) break;
    end += space.length;
    if (is_newline(space.code_point)) newline_end = end;
  }
  if (newline_end > 0) return newline_end;
  return whitespace_end(text, at);
}

}  // namespace

std::string_view split_pattern_name(SplitPattern pattern) { return pattern == SplitPattern::gpt2 ? "gpt2" : "llama3"; }

std::string_view split_pattern_regex(SplitPattern pattern) {
  return pattern == SplitPattern::gpt2 ? kGpt2Regex : kLlama3Regex;
}

std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::gpt2;
  if (regex == kLlama3Regex) return SplitPattern::llama3;
  return std::nullopt;
}

size_t split_piece_end(std::string_view text, SplitPattern pattern, size_t at) {
  return pattern == SplitPattern::gpt2 ? gpt2_piece_end(text, at) : llama3_piece_end(text, at);
}

std::vector<size_t> split_words(std::string_view text, SplitPattern pattern) {
  std::vector<size_t> piece_ends;
  for (size_t at = 0; at < text.size();) {
    at = split_piece_end(text, pattern, at);
    piece_ends.push_back(at);
  }
  return piece_ends;
}

}  // namespace tessera::train
