// Which tokens each micro-batch sees. Row b of micro-batch m (global index
// m = step * grad_accum + micro) starts at an offset drawn from
// Philox(seed, train stream, m * batch + b): the data depends only on the seed
// and the global index, never on who computes it or how steps are split, so a
// sharded run or a resumed one sees exactly the tokens of a plain run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tensor/tensor.h"
#include "train/corpus.h"

namespace tessera::train {

// inputs and targets: [batch, seq_len] i64; targets are the inputs shifted by one.
struct Batch {
  tessera::Tensor inputs;
  tessera::Tensor targets;
};

struct LoaderOptions {
  int64_t batch = 1;    // sequences per micro-batch
  int64_t seq_len = 1;  // tokens per sequence
  uint64_t seed = 0;
};

// The global index of micro-batch `micro` of optimizer step `step`.
inline int64_t global_micro_batch(int64_t step, int64_t grad_accum, int64_t micro) {
  return step * grad_accum + micro;
}

// Copies share one read-only TokenData: every local rank holds a copy of the
// loader, and the tokens are held once per process.
class DataLoader {
 public:
  // The last `val_fraction` of the tokens is held out for validation; each
  // split must hold at least seq_len + 1 tokens.
  DataLoader(TokenData data, LoaderOptions options, double val_fraction = 0.05);
  // Tokens drawn uniformly below `vocab` from the seed (no corpus): for
  // benchmarks and tests where only shapes and speed matter.
  static DataLoader synthetic(int64_t vocab, LoaderOptions options);

  Batch train_batch(int64_t micro_batch_index) const;
  // Validation batches come from their own Philox stream: batch i is the
  // same for every run with this seed.
  Batch val_batch(int64_t index) const;

  // The smallest vocab that covers every token the loader can return.
  int64_t token_range() const { return token_range_; }
  // Unigram entropy (nats) of the training split; ln(vocab) for synthetic data.
  double unigram_entropy() const { return unigram_entropy_; }
  int64_t train_tokens() const { return train_end_; }
  int64_t val_tokens() const;
  bool is_synthetic() const { return synthetic_vocab_ > 0; }
  const std::string& description() const { return data_->description; }
  // How the tokens were made, for the log ("" = nothing to say).
  const std::string& note() const { return data_->note; }
  const LoaderOptions& options() const { return options_; }
  // The tokens, shared by every copy of this loader (empty for synthetic data).
  const std::shared_ptr<const TokenData>& token_data() const { return data_; }

 private:
  DataLoader(LoaderOptions options, int64_t synthetic_vocab);
  Batch window_batch(int64_t micro_batch_index, uint64_t stream, int64_t begin, int64_t end) const;
  Batch synthetic_batch(int64_t micro_batch_index, uint64_t stream) const;

  std::shared_ptr<const TokenData> data_;
  LoaderOptions options_;
  int64_t synthetic_vocab_ = 0;  // > 0: synthetic data
  int64_t train_end_ = 0;        // tokens [0, train_end_) train, the rest validate
  int64_t token_range_ = 0;
  double unigram_entropy_ = 0.0;
};

}  // namespace tessera::train
