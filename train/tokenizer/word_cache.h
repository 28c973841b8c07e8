// The ids of words already encoded, so that a word met again (most words of
// a text are) costs one hash lookup instead of its merges. Bounded: when it
// holds kMaxWords words or kMaxIds ids it starts over empty. Words longer
// than kMaxWordBytes are not kept (rare, and each would crowd out many).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "train/tokenizer/bpe_model.h"

namespace tessera::train {

class WordCache {
 public:
  static constexpr size_t kMaxWords = size_t{1} << 18;
  static constexpr size_t kMaxIds = size_t{1} << 21;
  static constexpr size_t kMaxWordBytes = 256;

  // Appends the ids of `word` to `ids`: the cached ones, else model's
  // encoding (then cached).
  void encode(const BpeModel& model, std::string_view word, std::vector<uint32_t>& ids);

  size_t size() const { return index_.size(); }
  void clear();

 private:
  struct Span {
    uint32_t offset = 0;  // into ids_
    uint32_t count = 0;
  };
  std::unordered_map<std::string, Span, StringHash, std::equal_to<>> index_;
  std::vector<uint32_t> ids_;  // every cached word's ids, one after another
};

}  // namespace tessera::train
