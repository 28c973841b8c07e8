// The token stream's two widths behind one interface.
#include "train/token_stream.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "tensor/error.h"

namespace tessera::train {

TokenStream TokenStream::of_ids(std::span<const uint32_t> ids) {
  const bool narrow = std::all_of(ids.begin(), ids.end(), [](uint32_t id) { return id < kNarrowTokenVocab; });
  if (narrow) return TokenStream(std::vector<uint16_t>(ids.begin(), ids.end()));
  return TokenStream(std::vector<uint32_t>(ids.begin(), ids.end()));
}

int64_t TokenStream::size() const {
  return std::visit([](const auto& tokens) { return static_cast<int64_t>(tokens.size()); }, storage_);
}

int64_t TokenStream::bytes_per_token() const {
  return std::visit([](const auto& tokens) { return static_cast<int64_t>(sizeof(tokens[0])); }, storage_);
}

uint32_t TokenStream::operator[](int64_t index) const {
  return std::visit([index](const auto& tokens) { return static_cast<uint32_t>(tokens[static_cast<size_t>(index)]); },
                    storage_);
}

int64_t TokenStream::range() const {
  return std::visit(
      [](const auto& tokens) {
        return tokens.empty() ? int64_t{0} : static_cast<int64_t>(*std::max_element(tokens.begin(), tokens.end())) + 1;
      },
      storage_);
}

std::span<const std::byte> TokenStream::bytes() const {
  return std::visit([](const auto& tokens) { return std::as_bytes(std::span(tokens)); }, storage_);
}

void TokenStream::copy_to(int64_t begin, std::span<int64_t> out) const {
  TESSERA_CHECK(begin >= 0 && begin + static_cast<int64_t>(out.size()) <= size(),
                "token stream: tokens [{}, {}) are outside the stream's {}", begin,
                begin + static_cast<int64_t>(out.size()), size());
  std::visit([&](const auto& tokens) { std::copy_n(tokens.begin() + begin, out.size(), out.begin()); }, storage_);
}

std::vector<uint32_t> TokenStream::ids() const {
  return std::visit([](const auto& tokens) { return std::vector<uint32_t>(tokens.begin(), tokens.end()); },
                    storage_);
}

double unigram_entropy(const TokenStream& tokens, int64_t count) {
  TESSERA_CHECK(count >= 0 && count <= tokens.size(), "unigram_entropy: {} tokens asked of a stream of {}", count,
                tokens.size());
  if (count == 0) return 0.0;
  std::vector<int64_t> frequencies;
  if (tokens.bytes_per_token() == 2) {  // a table of 65,536 counts
    frequencies.assign(kNarrowTokenVocab, 0);
    for (int64_t i = 0; i < count; ++i) ++frequencies[tokens[i]];
  } else {  // wide ids can be anything up to 2^32: count only those that occur, summed in id order as above
    std::unordered_map<uint32_t, int64_t> counts;
    for (int64_t i = 0; i < count; ++i) ++counts[tokens[i]];
    std::vector<std::pair<uint32_t, int64_t>> by_id(counts.begin(), counts.end());
    std::sort(by_id.begin(), by_id.end());
    for (const auto& [id, seen] : by_id) frequencies.push_back(seen);
  }
  const double total = static_cast<double>(count);
  double entropy = 0.0;
  for (const int64_t seen : frequencies) {
    if (seen == 0) continue;
    const double p = static_cast<double>(seen) / total;
    entropy -= p * std::log(p);
  }
  return entropy;
}

}  // namespace tessera::train
