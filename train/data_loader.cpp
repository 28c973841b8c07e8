// Micro-batches from Philox-drawn offsets (token data) or Philox-drawn tokens
// (synthetic data).
#include "train/data_loader.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/philox.h"

namespace tessera::train {

namespace {

const uint64_t kTrainStream = tessera::stream_id_for("gpt.data.train");
const uint64_t kValStream = tessera::stream_id_for("gpt.data.val");

// 64 random bits for draw `index` of `key`.
uint64_t draw_u64(tessera::PhiloxKey key, uint64_t index) {
  auto words = tessera::philox4x32(key, index);
  return (static_cast<uint64_t>(words[1]) << 32) | words[0];
}

void check_options(const LoaderOptions& options) {
  TESSERA_CHECK(options.batch >= 1, "data: batch must be >= 1, got {}", options.batch);
  TESSERA_CHECK(options.seq_len >= 1, "data: seq_len must be >= 1, got {}", options.seq_len);
}

}  // namespace

DataLoader::DataLoader(TokenData data, LoaderOptions options, double val_fraction)
    : data_(std::make_shared<const TokenData>(std::move(data))), options_(options), token_range_(data_->token_range) {
  check_options(options_);
  TESSERA_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "data: val_fraction must be in (0, 1), got {}",
                val_fraction);
  const int64_t total = data_->tokens.size();
  const int64_t val = static_cast<int64_t>(std::ceil(static_cast<double>(total) * val_fraction));
  train_end_ = total - val;
  const int64_t window = options_.seq_len + 1;
  TESSERA_CHECK(train_end_ >= window && val >= window,
                "data: {} holds {} tokens: {} for training and {} for validation, but each split needs at least "
                "seq_len + 1 = {} tokens; use a larger file or a smaller --seq-len",
                data_->description, total, train_end_, val, window);
  unigram_entropy_ = train::unigram_entropy(data_->tokens, train_end_);
}

DataLoader::DataLoader(LoaderOptions options, int64_t synthetic_vocab)
    : options_(options), synthetic_vocab_(synthetic_vocab), token_range_(synthetic_vocab) {
  check_options(options_);
  TESSERA_CHECK(synthetic_vocab >= 1, "data: synthetic vocab must be >= 1, got {}", synthetic_vocab);
  TokenData none;
  none.description = fmt::format("synthetic (uniform tokens below {})", synthetic_vocab);
  data_ = std::make_shared<const TokenData>(std::move(none));
  unigram_entropy_ = std::log(static_cast<double>(synthetic_vocab));
}

DataLoader DataLoader::synthetic(int64_t vocab, LoaderOptions options) { return DataLoader(options, vocab); }

int64_t DataLoader::val_tokens() const {
  return is_synthetic() ? 0 : data_->tokens.size() - train_end_;
}

Batch DataLoader::train_batch(int64_t micro_batch_index) const {
  TESSERA_CHECK(micro_batch_index >= 0, "data: micro-batch index must be >= 0, got {}", micro_batch_index);
  if (is_synthetic()) return synthetic_batch(micro_batch_index, kTrainStream);
  return window_batch(micro_batch_index, kTrainStream, 0, train_end_);
}

Batch DataLoader::val_batch(int64_t index) const {
  TESSERA_CHECK(index >= 0, "data: validation batch index must be >= 0, got {}", index);
  if (is_synthetic()) return synthetic_batch(index, kValStream);
  return window_batch(index, kValStream, train_end_, data_->tokens.size());
}

// Row b reads tokens [offset, offset + T] of [begin, end), offset drawn at
// Philox index m * batch + b.
Batch DataLoader::window_batch(int64_t micro_batch_index, uint64_t stream, int64_t begin, int64_t end) const {
  const int64_t B = options_.batch, T = options_.seq_len;
  const uint64_t offsets = static_cast<uint64_t>(end - begin - T);  // windows of T + 1 tokens that fit
  const tessera::PhiloxKey key{options_.seed, stream};
  std::vector<int64_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  std::vector<int64_t> window(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t draw = draw_u64(key, static_cast<uint64_t>(micro_batch_index * B + b));
    data_->tokens.copy_to(begin + static_cast<int64_t>(draw % offsets), window);
    std::copy_n(window.begin(), T, inputs.begin() + b * T);
    std::copy_n(window.begin() + 1, T, targets.begin() + b * T);
  }
  return {tessera::ops::from_vector(inputs, {B, T}), tessera::ops::from_vector(targets, {B, T})};
}

// Row b holds the T + 1 tokens at Philox indices (m * batch + b) * (T + 1) + t.
Batch DataLoader::synthetic_batch(int64_t micro_batch_index, uint64_t stream) const {
  const int64_t B = options_.batch, T = options_.seq_len;
  const tessera::PhiloxKey key{options_.seed, stream};
  const uint64_t vocab = static_cast<uint64_t>(synthetic_vocab_);
  std::vector<int64_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t first = static_cast<uint64_t>((micro_batch_index * B + b) * (T + 1));
    int64_t previous = static_cast<int64_t>(draw_u64(key, first) % vocab);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t next = static_cast<int64_t>(draw_u64(key, first + static_cast<uint64_t>(t) + 1) % vocab);
      inputs[b * T + t] = previous;
      targets[b * T + t] = next;
      previous = next;
    }
  }
  return {tessera::ops::from_vector(inputs, {B, T}), tessera::ops::from_vector(targets, {B, T})};
}

}  // namespace tessera::train
