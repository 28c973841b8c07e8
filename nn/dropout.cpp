// nn::Dropout: a fresh Philox key per training call; identity in eval.
#include "nn/dropout.h"

#include "autograd/functions.h"

namespace tessera::nn {

Dropout::Dropout(double p) : Module("Dropout"), p_(p) {
  TESSERA_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got {}", p);
}

void Dropout::set_sequence_slice(int64_t dim, int64_t slices, int64_t index) {
  TESSERA_CHECK(dim >= 0 && slices >= 1 && index >= 0 && index < slices,
                "Dropout::set_sequence_slice: slice {} of {} along dim {}", index, slices, dim);
  sequence_slice_ = SequenceSlice{dim, slices, index};
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0) return x;
  PhiloxNumbering numbering;
  if (sequence_slice_) {
    const auto [dim, slices, index] = *sequence_slice_;
    TESSERA_CHECK(dim < x.dim(), "Dropout: a sequence slice along dim {} of an input of shape {}", dim, x.sizes());
    int64_t inner = 1;
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t run = x.size(dim) * inner;  // one outer index's rows of the slice
    numbering = {.first = static_cast<uint64_t>(index * run), .run = run, .stride = run * slices};
  }
  return tessera::dropout(x, p_, true, default_generator().next_key(), numbering);
}

}  // namespace tessera::nn
