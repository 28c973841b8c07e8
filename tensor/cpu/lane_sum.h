// Sums along a contiguous row in f64: 16 running sums, then a fixed tree, as
// the reduction kernels add. A row of f32 values (a vocabulary of 50257
// probabilities, a layer's activations) is then summed to f32 accuracy
// whatever its length, and to the same bits on every thread count and
// instruction set (the lanes are fixed, not the vector width).
#pragma once

#include <cstdint>

namespace tessera::cpu {

constexpr int64_t kSumLanes = 16;

// sum over i < n of term(i) (a double).
template <typename Term>
double lane_sum(int64_t n, const Term& term) {
  double lanes[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int64_t j = 0; j < kSumLanes; ++j) lanes[j] += term(i + j);
  }
  // The tail as one more block padded with zeros: lane j still takes
  // element i + j, and adding 0 changes no sum.
  double tail[kSumLanes] = {};
  for (int64_t j = 0; i + j < n; ++j) tail[j] = term(i + j);
  for (int64_t j = 0; j < kSumLanes; ++j) lanes[j] += tail[j];
  for (int64_t width = kSumLanes / 2; width > 0; width /= 2) {
    for (int64_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
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
