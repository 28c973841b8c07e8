// How far a tensor is from its reference, for tests that hold a result to a
// bound: the worst absolute difference, and the same over the reference's
// scale. Both REQUIRE equal shapes.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/tensor.h"

namespace tessera::testing {

inline double max_abs_difference(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.sizes() == expected.sizes());
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - e[i]));
  return worst;
}

// The worst |actual - expected| over the tensor's scale max(1, max |expected|):
// rounding error is relative to the magnitudes a result is summed from, not
// to each element (a logit near 0 is the sum of terms as large as the rest).
inline double max_scaled_difference(const Tensor& actual, const Tensor& expected) {
  double scale = 1.0;
  for (double value : expected.to_vector<double>()) scale = std::max(scale, std::abs(value));
  return max_abs_difference(actual, expected) / scale;
}

}  // namespace tessera::testing
