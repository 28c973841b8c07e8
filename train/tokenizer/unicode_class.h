// The four character classes the pre-tokenizer regexes of GPT-2 and Llama 3
// tell apart: \p{L}, \p{N}, \s and everything else, for any code point, from
// tables generated from the Unicode Character Database
// (tools/make_unicode_classes.py writes unicode_class_ranges.h).
#pragma once

#include <cstdint>

namespace tessera::train {

enum class CharClass : uint8_t {
  other,   // none of the three below: punctuation, symbols, marks, controls, unassigned
  letter,  // \p{L}: general category L (Lu, Ll, Lt, Lm, Lo)
  number,  // \p{N}: general category N (Nd, Nl, No)
  space,   // \s: U+0009..U+000D, U+0085 and the categories Zs, Zl, Zp
};

// The class of `code_point` (above U+10FFFF: other).
CharClass char_class(char32_t code_point);

// The Unicode version the tables were generated from ("16.0.0").
const char* unicode_version();

}  // namespace tessera::train
