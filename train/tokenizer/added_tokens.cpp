// Leftmost-longest matching of the added tokens, in two passes.
#include "train/tokenizer/added_tokens.h"

#include <algorithm>

#include "tensor/error.h"

namespace tessera::train {

AddedTokens::AddedTokens(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (const AddedToken& token : tokens_) {
    TESSERA_CHECK(!token.content.empty(), "added token {} has empty content", token.id);
  }
  build_pass(raw_pass_, false);
  build_pass(normalized_pass_, true);
}

void AddedTokens::build_pass(Pass& pass, bool normalized) const {
  for (size_t index = 0; index < tokens_.size(); ++index) {
    if (tokens_[index].normalized != normalized) continue;
    pass.by_first_byte[static_cast<uint8_t>(tokens_[index].content.front())].push_back(index);
    pass.empty = false;
  }
  for (auto& candidates : pass.by_first_byte) {
    std::stable_sort(candidates.begin(), candidates.end(),
                     [this](size_t a, size_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
  }
}

void AddedTokens::split_range(std::string_view text, size_t begin, size_t end, const Pass& pass,
                              std::vector<TextSegment>& segments) const {
  size_t text_start = begin;
  for (size_t at = begin; at < end;) {
    const AddedToken* match = nullptr;
    for (const size_t index : pass.by_first_byte[static_cast<uint8_t>(text[at])]) {
      if (text.substr(at, end - at).starts_with(tokens_[index].content)) {
        match = &tokens_[index];  // the longest, as they are sorted
        break;
      }
    }
    if (match == nullptr) {
      ++at;
      continue;
    }
    if (text_start < at) segments.push_back({text_start, at, TextSegment::kText});
    segments.push_back({at, at + match->content.size(), match->id});
    at += match->content.size();
    text_start = at;
  }
  if (text_start < end) segments.push_back({text_start, end, TextSegment::kText});
}

void AddedTokens::split(std::string_view text, std::vector<TextSegment>& segments) const {
  segments.clear();
  split_range(text, 0, text.size(), raw_pass_, segments);
  if (normalized_pass_.empty) return;
  std::vector<TextSegment> first_pass;
  first_pass.swap(segments);
  for (const TextSegment& segment : first_pass) {
    if (segment.token != TextSegment::kText) {
      segments.push_back(segment);
    } else {
      split_range(text, segment.begin, segment.end, normalized_pass_, segments);
    }
  }
}

}  // namespace tessera::train
