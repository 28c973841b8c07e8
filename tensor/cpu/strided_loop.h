// StridedLoop: walks N same-shaped operands of any strides (zero strides from
// expand included) as a few runs along the innermost dim, so an elementwise
// kernel writes one inner loop and vectorises it when the run is dense.
// Dims of size 1 are dropped and adjacent dims merged wherever every operand
// allows, so [B, T, C] + [C] runs as B*T runs of C and a contiguous tensor as one.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "tensor/parallel.h"
#include "tensor/tensor.h"

namespace tessera::cpu {

template <size_t N>
class StridedLoop {
 public:
  using Pointers = std::array<char*, N>;
  using Strides = std::array<int64_t, N>;  // in bytes

  // operands[0] sets the shape; every operand must have it. By default dims
  // are ordered so that operand 0 is walked in memory order; with
  // keep_logical_order the position of an element in the walk is its flat
  // logical index (what kernels keyed by index, such as random numbers, need).
  explicit StridedLoop(const std::array<const Tensor*, N>& operands, bool keep_logical_order = false) {
    const Shape& shape = operands[0]->sizes();
    for (const Tensor* operand : operands) {
      TESSERA_CHECK(operand->sizes() == shape, "StridedLoop: operand shape {} differs from {}", operand->sizes(),
                    shape);
    }
    numel_ = shape_numel(shape);
    if (numel_ == 0) return;
    for (size_t k = 0; k < N; ++k) base_[k] = static_cast<char*>(operands[k]->raw_data());

    struct Dim {
      int64_t size;
      Strides strides;
    };
    std::vector<Dim> dims;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      Dim dim{shape[d], {}};
      for (size_t k = 0; k < N; ++k) {
        dim.strides[k] = operands[k]->strides()[d] * static_cast<int64_t>(operands[k]->element_size());
      }
      dims.push_back(dim);
    }
    if (!keep_logical_order) {
      // Outermost first: larger strides of operand 0 first, later operands break ties.
      std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) {
        for (size_t k = 0; k < N; ++k) {
          if (a.strides[k] != b.strides[k]) return a.strides[k] > b.strides[k];
        }
        return false;
      });
    }
    // Merge an outer dim into the inner one when every operand steps over the
    // inner dim exactly as far as one outer step.
    std::vector<Dim> merged;
    for (const Dim& dim : dims) {
      if (!merged.empty()) {
        Dim& outer = merged.back();
        bool mergeable = true;
        for (size_t k = 0; k < N; ++k) mergeable = mergeable && outer.strides[k] == dim.strides[k] * dim.size;
        if (mergeable) {
          outer.size *= dim.size;
          outer.strides = dim.strides;
          continue;
        }
      }
      merged.push_back(dim);
    }
    if (merged.empty()) merged.push_back(Dim{1, {}});
    for (const Dim& dim : merged) {
      sizes_.push_back(dim.size);
      strides_.push_back(dim.strides);
    }
  }

  int64_t numel() const { return numel_; }
  // Length and byte strides of the innermost run (after merging).
  int64_t inner_size() const { return sizes_.empty() ? 0 : sizes_.back(); }
  const Strides& inner_strides() const { return strides_.back(); }

  // Calls inner(pointers, strides, count) for each run covering walk
  // positions [begin, end).
  template <typename Inner>
  void run(int64_t begin, int64_t end, const Inner& inner) const {
    run_indexed(begin, end, [&](const Pointers& pointers, const Strides& strides, int64_t count, int64_t) {
      inner(pointers, strides, count);
    });
  }

  // As run, also passing the walk position of the run's first element.
  template <typename Inner>
  void run_indexed(int64_t begin, int64_t end, const Inner& inner) const {
    if (begin >= end) return;
    const auto ndim = static_cast<int64_t>(sizes_.size());
    std::vector<int64_t> index(static_cast<size_t>(ndim));
    Pointers pointers = base_;
    int64_t remainder = begin;
    for (int64_t d = ndim - 1; d >= 0; --d) {
      index[d] = remainder % sizes_[d];
      remainder /= sizes_[d];
      for (size_t k = 0; k < N; ++k) pointers[k] += index[d] * strides_[d][k];
    }
    const Strides& inner_strides = strides_.back();
    const int64_t inner_size = sizes_.back();
    int64_t position = begin;
    while (true) {
      const int64_t count = std::min(inner_size - index[ndim - 1], end - position);
      inner(pointers, inner_strides, count, position);
      position += count;
      if (position >= end) return;
      // The run ended at the end of the inner dim: rewind it and carry outwards.
      for (size_t k = 0; k < N; ++k) pointers[k] -= index[ndim - 1] * inner_strides[k];
      index[ndim - 1] = 0;
      for (int64_t d = ndim - 2; d >= 0; --d) {
        for (size_t k = 0; k < N; ++k) pointers[k] += strides_[d][k];
        if (++index[d] < sizes_[d]) break;
        for (size_t k = 0; k < N; ++k) pointers[k] -= sizes_[d] * strides_[d][k];
        index[d] = 0;
      }
    }
  }

  // run over all positions, split across threads in chunks of at least `grain`.
  template <typename Inner>
  void parallel_run(int64_t grain, const Inner& inner) const {
    parallel_for(numel_, grain, [&](int64_t begin, int64_t end) { run(begin, end, inner); });
  }
  template <typename Inner>
  void parallel_run_indexed(int64_t grain, const Inner& inner) const {
    parallel_for(numel_, grain, [&](int64_t begin, int64_t end) { run_indexed(begin, end, inner); });
  }

 private:
  int64_t numel_ = 0;
  Shape sizes_;                   // innermost last
  std::vector<Strides> strides_;  // per dim
  Pointers base_{};
};

}  // namespace tessera::cpu
