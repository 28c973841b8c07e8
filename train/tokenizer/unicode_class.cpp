// Character classes: a table for ASCII, a binary search of the generated
// ranges above it.
#include "train/tokenizer/unicode_class.h"

#include <algorithm>
#include <array>
#include <iterator>

#include "train/tokenizer/unicode_class_ranges.h"

namespace tessera::train {

namespace {

using unicode_tables::ClassRange;
using unicode_tables::kClassRanges;

CharClass search_ranges(char32_t code_point) {
  // The first range that ends at or after the code point.
  const ClassRange* range =
      std::lower_bound(std::begin(kClassRanges), std::end(kClassRanges), code_point,
                       [](const ClassRange& candidate, char32_t value) { return candidate.last < value; });
  if (range == std::end(kClassRanges) || range->first > code_point) return CharClass::other;
  return range->char_class;
}

const std::array<CharClass, 128> kAsciiClasses = [] {
  std::array<CharClass, 128> classes{};
  for (char32_t c = 0; c < 128; ++c) classes[c] = search_ranges(c);
  return classes;
}();

}  // namespace

CharClass char_class(char32_t code_point) {
  if (code_point < 128) return kAsciiClasses[code_point];
  return search_ranges(code_point);
}

const char* unicode_version() { return unicode_tables::kUnicodeVersion; }

}  // namespace tessera::train
