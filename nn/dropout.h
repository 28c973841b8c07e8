// nn::Dropout: inverted dropout in training (each kept element scaled by
// 1/(1-p)), identity in eval. Each training call draws a fresh Philox key from
// the calling thread's default generator, so tessera::manual_seed makes runs
// repeatable and each simulated rank draws its own masks.
#pragma once

#include <optional>

#include "nn/module.h"

namespace tessera::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);  // 0 <= p < 1
  Tensor forward(const Tensor& x) override;
  double p() const { return p_; }

  // Sequence parallelism (tp's style): the input is slice `index` of
  // `slices` equal slices along `dim` of the whole activation, and the mask
  // drawn is that slice of the whole activation's mask, so that the ranks
  // together drop what one rank would (given the same key: the ranks' default
  // generators must agree).
  void set_sequence_slice(int64_t dim, int64_t slices, int64_t index);

 private:
  struct SequenceSlice {
    int64_t dim;
    int64_t slices;
    int64_t index;
  };
  double p_;
  std::optional<SequenceSlice> sequence_slice_;
};

}  // namespace tessera::nn
