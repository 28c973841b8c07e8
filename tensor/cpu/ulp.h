// Distance in units in the last place (ulp) between an f32 result and the
// exact value it approximates: how the accuracy of vector_math.h is stated,
// measured (bench/vector_math) and tested.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace tessera::cpu {

// |result - exact| in units of the f32 spacing at `exact` (2^-149 among the
// subnormals); `exact` is a double, far more precise than f32. A result that
// should be NaN or infinite (exact rounds to inf in f32) must be that, or the
// error is infinite.
inline double ulp_error(float result, double exact) {
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  const float rounded = static_cast<float>(exact);
  if (std::isnan(exact) || std::isnan(result)) return std::isnan(exact) && std::isnan(result) ? 0.0 : kInfinity;
  if (std::isinf(rounded) || std::isinf(result)) return result == rounded ? 0.0 : kInfinity;
  const int exponent = exact == 0.0 ? -126 : std::max(std::ilogb(exact), -126);
  return std::abs(static_cast<double>(result) - exact) / std::ldexp(1.0, exponent - 23);
}

// Whether `result` differs from `exact` (rounded to f32) in a special value:
// NaN, an infinity, or the sign of a zero.
inline bool special_value_differs(float result, double exact) {
  const float rounded = static_cast<float>(exact);
  if (std::isnan(rounded) || std::isnan(result)) return std::isnan(rounded) != std::isnan(result);
  if (std::isinf(rounded) || std::isinf(result)) return rounded != result;
  return rounded == 0.0f && result == 0.0f && std::signbit(rounded) != std::signbit(result);
}

}  // namespace tessera::cpu
