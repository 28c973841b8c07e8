// The pre-tokenizer regexes of GPT-2 and Llama 3, as hand-written scanners
// over UTF-8 code points (std::regex has no \p{..}). A regex split cuts text
// into the pieces the regex matches one after another; in both patterns every
// character starts some match, so the pieces tile the text and BPE then
// encodes each piece (a "word") on its own:
//   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// matched as Hugging Face `tokenizers` matches them (Oniguruma: leftmost
// alternative first, greedy with backtracking; `(?i)` folds 's' with 'S' and
// 'ſ' U+017F). The regex sees the text through decode_utf8_char: a maximal
// ill-formed subpart is one U+FFFD (class other) spanning its bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace tessera::train {

enum class SplitPattern { gpt2, llama3 };

// The pattern's name ("gpt2", "llama3").
std::string_view split_pattern_name(SplitPattern pattern);

// The regex as a tokenizer.json writes it.
std::string_view split_pattern_regex(SplitPattern pattern);

// The pattern whose regex is exactly `regex`; nullopt for any other.
std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex);

// The end (a byte offset) of the piece that starts at byte `at` < text.size():
// the regex's match there. The next piece starts where this one ends.
size_t split_piece_end(std::string_view text, SplitPattern pattern, size_t at);

// Where each piece of `text` ends: byte offsets, ascending, the last one
// text.size() (none for empty text).
std::vector<size_t> split_words(std::string_view text, SplitPattern pattern);

}  // namespace tessera::train
