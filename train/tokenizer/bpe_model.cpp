// The vocabulary and merges checked and indexed, and a word's merges by rank.
#include "train/tokenizer/bpe_model.h"

#include <algorithm>
#include <queue>

#include "tensor/error.h"
#include "train/tokenizer/byte_alphabet.h"

namespace tessera::train {

BpeModel::BpeModel(const BpeSpec& spec) : ignore_merges_(spec.ignore_merges) {
  TESSERA_CHECK(!spec.vocab.empty(), "{}: the vocab is empty", spec.source);
  uint32_t largest = 0;
  for (const auto& [text, id] : spec.vocab) {
    TESSERA_CHECK(id <= kMaxTokenId, "{}: token '{}' has id {}, above the largest id tessera takes ({})", spec.source,
                  text, id, kMaxTokenId);
    largest = std::max(largest, id);
  }
  const size_t count = size_t{largest} + 1;
  has_token_.resize(count);
  std::vector<const std::string*> text_of_id(count, nullptr);
  std::unordered_map<std::string_view, uint32_t> id_of_text;
  for (const auto& [text, id] : spec.vocab) {
    TESSERA_CHECK(text_of_id[id] == nullptr, "{}: the vocab gives id {} to both '{}' and '{}'", spec.source, id,
                  *text_of_id[id], text);
    text_of_id[id] = &text;
    has_token_[id] = true;
    id_of_text.emplace(text, id);
  }
  token_offsets_.reserve(count + 1);
  for (uint32_t id = 0; id < count; ++id) {
    token_offsets_.push_back(all_token_bytes_.size());
    if (text_of_id[id] == nullptr) continue;
    if (std::optional<std::string> bytes = alphabet_text_to_bytes(*text_of_id[id])) {
      id_of_bytes_.emplace(*bytes, id);
      all_token_bytes_ += *bytes;
    } else {
      all_token_bytes_ += *text_of_id[id];
    }
  }
  token_offsets_.push_back(all_token_bytes_.size());
  for (uint32_t byte = 0; byte < 256; ++byte) {
    const std::optional<uint32_t> id = token_id(std::string(1, static_cast<char>(byte)));
    std::string character;
    append_utf8(byte_to_alphabet(static_cast<uint8_t>(byte)), character);
    TESSERA_CHECK(id.has_value(),
                  "{}: the vocab has no token for byte 0x{:02X} ('{}'); a byte-level BPE vocab needs all 256",
                  spec.source, byte, character);
    byte_ids_[byte] = *id;
  }
  merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    const auto find = [&](const std::string& text) {
      const auto found = id_of_text.find(text);
      TESSERA_CHECK(found != id_of_text.end(), "{}: merge {} ('{}' '{}'): '{}' is not in the vocab", spec.source, rank,
                    left, right, text);
      return found->second;
    };
    const uint32_t left_id = find(left), right_id = find(right), merged_id = find(left + right);
    // A pair listed twice keeps its last rank, as Hugging Face's BPE does.
    merges_[pair_key(left_id, right_id)] = Merge{static_cast<uint32_t>(rank), merged_id};
  }
}

std::optional<std::string_view> BpeModel::token_bytes(uint32_t id) const {
  if (id >= has_token_.size() || !has_token_[id]) return std::nullopt;
  return std::string_view(all_token_bytes_).substr(token_offsets_[id], token_offsets_[id + 1] - token_offsets_[id]);
}

std::optional<uint32_t> BpeModel::token_id(std::string_view bytes) const {
  const auto found = id_of_bytes_.find(bytes);
  if (found == id_of_bytes_.end()) return std::nullopt;
  return found->second;
}

std::optional<BpeModel::Merge> BpeModel::find_merge(uint32_t left, uint32_t right) const {
  const auto found = merges_.find(pair_key(left, right));
  if (found == merges_.end()) return std::nullopt;
  return found->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<uint32_t>& ids) const {
  if (ignore_merges_) {
    if (const std::optional<uint32_t> whole = token_id(word)) {
      ids.push_back(*whole);
      return;
    }
  }
  merge_by_rank(word, ids);
}

// The symbols are the word's bytes at first, linked as a list; a merge folds
// the right symbol into the left one. The heap holds every adjacent pair that
// has a merge, lowest rank first, then leftmost; an entry whose symbols have
// changed since it was pushed is stale and skipped.
void BpeModel::merge_by_rank(std::string_view word, std::vector<uint32_t>& ids) const {
  constexpr uint32_t kNone = UINT32_MAX;
  struct Symbol {
    uint32_t id;
    uint32_t prev, next;  // positions of the neighbours, kNone at the ends
    bool alive;
  };
  struct Candidate {
    uint32_t rank, left, right;  // the pair at positions left, right ...
    uint32_t left_id, right_id;  // ... when these were their tokens
    uint32_t merged_id;
    bool operator>(const Candidate& other) const { return rank != other.rank ? rank > other.rank : left > other.left; }
  };
  const auto n = static_cast<uint32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (uint32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<uint8_t>(word[i])], i == 0 ? kNone : i - 1, i + 1 == n ? kNone : i + 1, true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push_pair = [&](uint32_t left) {
    if (left == kNone || symbols[left].next == kNone) return;
    const uint32_t right = symbols[left].next;
    if (const std::optional<Merge> merge = find_merge(symbols[left].id, symbols[right].id)) {
      heap.push({merge->rank, left, right, symbols[left].id, symbols[right].id, merge->merged_id});
    }
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (!left.alive || !right.alive || left.next != top.right || left.id != top.left_id || right.id != top.right_id) {
      continue;  // stale
    }
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next != kNone) symbols[right.next].prev = top.left;
    push_pair(left.prev);
    push_pair(top.left);
  }
  for (uint32_t i = n == 0 ? kNone : 0; i != kNone; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace tessera::train
