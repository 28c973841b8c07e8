// A bounded map from words to their ids, the ids kept in one buffer.
#include "train/tokenizer/word_cache.h"

namespace tessera::train {

void WordCache::encode(const BpeModel& model, std::string_view word, std::vector<uint32_t>& ids) {
  if (const auto found = index_.find(word); found != index_.end()) {
    const uint32_t* first = ids_.data() + found->second.offset;
    ids.insert(ids.end(), first, first + found->second.count);
    return;
  }
  const size_t before = ids.size();
  model.encode_word(word, ids);
  if (word.size() > kMaxWordBytes) return;
  if (index_.size() >= kMaxWords || ids_.size() >= kMaxIds) clear();
  const Span span{static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(ids.size() - before)};
  ids_.insert(ids_.end(), ids.begin() + static_cast<std::ptrdiff_t>(before), ids.end());
  index_.emplace(std::string(word), span);
}

void WordCache::clear() {
  index_.clear();
  ids_.clear();
}

}  // namespace tessera::train
