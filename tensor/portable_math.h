// The logarithm and the cosine that Box-Muller needs, in f64, built only from
// operations IEEE 754 rounds exactly (+, -, *, /, and frexp, which does not
// round). Every CPU, libm and GPU therefore computes the same bits, so a
// normal drawn on a GPU, or under another glibc, is the cpu's normal. The
// log is within 1 ulp and the cosine within 2 (tests/tensor/test_core.cpp
// measures them against long double: 0.78 and 1.69 at worst); neither tries
// to be correctly rounded. Requires contraction off (-ffp-contract=off, nvcc -fmad=false):
// a fused multiply-add rounds once where the source rounds twice.
#pragma once

#include <cmath>

#include "tensor/host_device.h"

namespace tessera::portable_math {

// frexp is exact on every IEEE machine: it only takes the exponent apart.
TESSERA_HOST_DEVICE inline double split_exponent(double x, int* exponent) {
#if defined(__CUDA_ARCH__)
  return frexp(x, exponent);
#else
  return std::frexp(x, exponent);
#endif
}

// ln(x) for finite x > 0 (Box-Muller's x is in (2^-32, 1]).
// x = m 2^e with m = 1 + f in [sqrt(1/2), sqrt(2)). With s = f / (2 + f),
// ln(1 + f) = 2 atanh(s) = 2s + s r, r = 2s^2/3 + 2s^4/5 + ... (to s^22,
// past which the terms are below 2^-58 of the sum; |s| <= 0.1716), and
// 2s = f - f^2/2 + s f^2/2, so the sum is taken as f minus a small
// correction: f is exact, and only the correction rounds (fdlibm's
// arrangement). ln(2) is in two parts, so that e ln(2) adds exactly.
TESSERA_HOST_DEVICE inline double log(double x) {
  constexpr double kLn2High = 0x1.62e42p-1;          // 21 bits: e * kLn2High is exact
  constexpr double kLn2Low = 0x1.fdf473de6af28p-22;  // ln(2) - kLn2High
  constexpr double kSqrtHalf = 0.70710678118654752440;
  int exponent = 0;
  double m = split_exponent(x, &exponent);  // [0.5, 1)
  if (m < kSqrtHalf) {
    m *= 2.0;  // exact
    exponent -= 1;
  }
  const double f = m - 1.0;  // exact (Sterbenz)
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double r =
      z * (2.0 / 3.0 + z * (2.0 / 5.0 + z * (2.0 / 7.0 + z * (2.0 / 9.0 + z * (2.0 / 11.0 + z * (2.0 / 13.0 +
      z * (2.0 / 15.0 + z * (2.0 / 17.0 + z * (2.0 / 19.0 + z * (2.0 / 21.0 + z * (2.0 / 23.0)))))))))));
  const double half_f_squared = 0.5 * f * f;
  const double e = static_cast<double>(exponent);
  return e * kLn2High - ((half_f_squared - (s * (half_f_squared + r) + e * kLn2Low)) - f);
}

// cos(2 pi turns) for turns in [0, 1) (Box-Muller's is a multiple of 2^-32).
// 4 turns = q + t splits exactly into a quarter q and t in [0, 1); each
// quarter is +-cos or +-sin of (pi/2) t, taken on [0, pi/4] through
// sin(pi/2 t) = cos(pi/2 (1 - t)), with Taylor series to x^18/18! and
// x^19/19!, whose first omitted terms are below 2^-60 there.
TESSERA_HOST_DEVICE inline double cos_of_turns(double turns) {
  constexpr double kHalfPi = 0x1.921fb54442d18p+0;
  const double quarters = 4.0 * turns;  // exact
  const int quarter = static_cast<int>(quarters);
  double t = quarters - quarter;  // exact
  bool use_sin = quarter % 2 == 1;
  if (t > 0.5) {
    t = 1.0 - t;  // exact
    use_sin = !use_sin;
  }
  const double x = kHalfPi * t;
  const double x2 = x * x;
  // Every k! to 19! is exactly a double, so each coefficient is 1/k! rounded once.
  const double value =
      use_sin ? x + x * x2 * (-1.0 / 6.0 + x2 * (1.0 / 120.0 + x2 * (-1.0 / 5040.0 + x2 * (1.0 / 362880.0 +
                x2 * (-1.0 / 39916800.0 + x2 * (1.0 / 6227020800.0 + x2 * (-1.0 / 1307674368000.0 +
                x2 * (1.0 / 355687428096000.0 + x2 * (-1.0 / 121645100408832000.0)))))))))
              : 1.0 + x2 * (-1.0 / 2.0 + x2 * (1.0 / 24.0 + x2 * (-1.0 / 720.0 + x2 * (1.0 / 40320.0 +
                x2 * (-1.0 / 3628800.0 + x2 * (1.0 / 479001600.0 + x2 * (-1.0 / 87178291200.0 +
                x2 * (1.0 / 20922789888000.0 + x2 * (-1.0 / 6402373705728000.0)))))))));
  // cos over the quarters: +cos, -sin, -cos, +sin.
  return quarter == 1 || quarter == 2 ? -value : value;
}

}  // namespace tessera::portable_math
