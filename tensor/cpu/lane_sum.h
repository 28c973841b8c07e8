// Reductions along a contiguous row over 16 fixed lanes joined by a fixed
// tree: what the reduction kernels and the row kernels (softmax, norms,
// cross-entropy, attention) add with. Sums accumulate in f64, so a row of f32
// values (a vocabulary of 50257 probabilities, a layer's activations) is
// summed to f32 accuracy whatever its length, and to the same bits on every
// thread count and instruction set (the lanes are fixed, not the vector width).
#pragma once

#include <cstdint>

namespace tessera::cpu {

constexpr int64_t kReductionLanes = 16;

// combine over term(0), ..., term(n-1): lane j takes elements j, j + 16, ...
// from `identity`, then the lanes are joined pairwise (0 with 8, ...).
template <typename Acc, typename Term, typename Combine>
Acc lane_reduce(int64_t n, Acc identity, const Term& term, const Combine& combine) {
  Acc lanes[kReductionLanes];
  for (Acc& lane : lanes) lane = identity;
  int64_t i = 0;
  for (; i + kReductionLanes <= n; i += kReductionLanes) {
    for (int64_t j = 0; j < kReductionLanes; ++j) lanes[j] = combine(lanes[j], term(i + j));
  }
  // The tail as one more block padded with the identity: lane j still takes
  // element i + j, and combining with the identity changes no lane.
  Acc tail[kReductionLanes];
  for (int64_t j = 0; j < kReductionLanes; ++j) tail[j] = i + j < n ? term(i + j) : identity;
  for (int64_t j = 0; j < kReductionLanes; ++j) lanes[j] = combine(lanes[j], tail[j]);
  for (int64_t width = kReductionLanes / 2; width > 0; width /= 2) {
    for (int64_t j = 0; j < width; ++j) lanes[j] = combine(lanes[j], lanes[j + width]);
  }
  return lanes[0];
}

// sum over i < n of term(i) (a double).
template <typename Term>
double lane_sum(int64_t n, const Term& term) {
  return lane_reduce(n, 0.0, term, [](double a, double b) { return a + b; });
}

// x[0] + ... + x[n-1].
template <typename T>
double lane_sum(const T* x, int64_t n) {
  return lane_sum(n, [x](int64_t i) { return static_cast<double>(x[i]); });
}

// a[0] b[0] + ... + a[n-1] b[n-1], each product exact in f64 for f32 inputs.
template <typename T>
double lane_dot(const T* a, const T* b, int64_t n) {
  return lane_sum(n, [a, b](int64_t i) { return static_cast<double>(a[i]) * static_cast<double>(b[i]); });
}

}  // namespace tessera::cpu
