// A run's token stream, stored in the narrowest width that holds its ids:
// uint16 while every id is below 65,536 (GPT-2's 50,257, bytes), uint32
// beyond (Llama 3's 128,256). The two widths are llm.c's token files of
// version 1 and 2 (corpus.h). Narrow streams keep half the memory, and their
// bytes, which a run's identity checksums, are those every earlier run had.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

namespace tessera::train {

// The largest vocabulary whose ids fit the narrow width.
inline constexpr int64_t kNarrowTokenVocab = 65536;

class TokenStream {
 public:
  TokenStream() = default;
  explicit TokenStream(std::vector<uint16_t> narrow) : storage_(std::move(narrow)) {}
  explicit TokenStream(std::vector<uint32_t> wide) : storage_(std::move(wide)) {}

  // `ids` in the narrow width when every one fits, else the wide.
  static TokenStream of_ids(std::span<const uint32_t> ids);

  int64_t size() const;
  bool empty() const { return size() == 0; }
  // 2 (narrow) or 4 (wide).
  int64_t bytes_per_token() const;
  uint32_t operator[](int64_t index) const;
  // The largest id + 1 (0 when empty): the smallest vocabulary that covers the stream.
  int64_t range() const;
  // The stored bytes, in the machine's order (llm.c's files are little-endian, as x86 and Arm Linux are).
  std::span<const std::byte> bytes() const;

  // Tokens [begin, begin + out.size()) widened into `out`: the data loader's windows.
  void copy_to(int64_t begin, std::span<int64_t> out) const;
  // Every id, widened: for tests and small streams.
  std::vector<uint32_t> ids() const;

  // Equal ids in equal widths.
  bool operator==(const TokenStream&) const = default;

 private:
  std::variant<std::vector<uint16_t>, std::vector<uint32_t>> storage_;
};

// Entropy in nats of the frequencies of tokens [0, count): the loss of the
// best model that knows only how often each token occurs, and so the bar a
// trained model must beat by using context.
double unigram_entropy(const TokenStream& tokens, int64_t count);

}  // namespace tessera::train
