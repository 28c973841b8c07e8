// Vectorised f32 exp, log, tanh, erf and sigmoid, written once over
// FloatVector's exact operations (float_vector.h): every instruction set with
// FMA computes the same bits, and the special values are those of IEEE and
// std::, by construction rather than by a library's clamping:
//   exp:  -inf -> +0, +inf -> +inf, results below 2^-126 round into the
//         subnormals, beyond 88.72 overflow to +inf;
//   log:  +-0 -> -inf, x < 0 -> NaN, +inf -> +inf, subnormal inputs exact;
//   tanh, erf: odd (-0 -> -0), +-inf -> +-1;
//   sigmoid: -inf -> +0, +inf -> 1, subnormal results for x < -87.3;
//   NaN in, NaN out, everywhere.
// Error bounds against the exact value, in ulp of the result, and the largest
// error over all 2^32 floats (`build/bench/vector_math` measures it):
// exp 1 (0.99), log 1 (0.84), tanh 1.5 (1.33), erf 1.5 (1.11), sigmoid 1.5
// (1.48). The double overloads are std::.
//
// Each function reduces its argument to a short interval where a polynomial
// (tools/fit_vector_math.py fits the coefficients, lowest degree first) is far
// more accurate than f32, so the error is the few roundings around it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/cpu/float_vector.h"

namespace tessera::cpu::vec {

namespace kernel {

// degree 5 on [-0.346574, 0.346574], fit error 1.40e-09
constexpr float kExp[] = {0.500000001f, 0.166666667f, 0.041666465f, 0.00833331093f, 0.0013933641f, 0.000198909809f};
// degree 3 on [0, 0.0294373], fit error 1.15e-09
constexpr float kLog[] = {0.666666666f, 0.400001218f, 0.285508208f, 0.233304672f};
// degree 5 on [0, 0.390625], fit error 1.60e-09
constexpr float kTanh[] = {-0.333333332f, 0.133333036f, -0.0539592596f, 0.0217689187f, -0.00834394552f, 0.00229274482f};
// degree 7 on [0, 1], fit error 3.38e-11
constexpr float kErf[] = {0.128379167f,     -0.376126385f,    0.112837825f,   -0.0268654307f,
                          0.00522103181f,   -0.000848408041f, 0.00011265959f, -9.66704457e-06f};
// degree 11 on [-1.5, 1.45], fit error 8.33e-09
constexpr float kErfcx[] = {0.210806359f,    -0.0743473365f,  0.0249381729f,   -0.00800170799f,
                            0.00246611194f,  -0.000733086197f, 0.000212784477f, -5.96255749e-05f,
                            1.44631728e-05f, -3.68526989e-06f, 1.64964579e-06f, -4.39346611e-07f};

// ln 2 = kLn2High + kLn2Low, the high part with 15 significant bits, so that
// n * kLn2High is exact for |n| < 512 with or without FMA.
constexpr float kLn2High = 0.693145751953125f;
constexpr float kLn2Low = 1.42860677e-06f;

// c[0] + c[1] x + ... + c[N-1] x^(N-1), by Horner's rule with one rounding per step.
template <size_t N>
FloatVector polynomial(FloatVector x, const float (&c)[N]) {
  FloatVector sum(c[N - 1]);
  for (size_t i = N - 1; i-- > 0;) sum = fma(sum, x, FloatVector(c[i]));
  return sum;
}

}  // namespace kernel

// exp(x) = 2^n exp(r) with n = round(x / ln 2) and |r| <= ln2 / 2.
inline FloatVector exp(FloatVector x) {
  using namespace kernel;
  // Beyond [-104, 89] the result is already 0 or inf; inside, n is in
  // [-150, 128], which scale_by_power_of_two takes in one rounding.
  const FloatVector clamped = clamp(x, FloatVector(-104.0f), FloatVector(89.0f));
  // Adding and removing 1.5 * 2^23 rounds to the nearest integer.
  const FloatVector round = 12582912.0f;
  const FloatVector n = (clamped * FloatVector(1.44269504f) + round) - round;
  const FloatVector r = fma(n, FloatVector(-kLn2Low), fma(n, FloatVector(-kLn2High), clamped));
  const FloatVector exp_r = FloatVector(1.0f) + fma(r * r, polynomial(r, kExp), r);  // 1 + r + r^2 q(r)
  return scale_by_power_of_two(exp_r, n);  // a NaN x made exp_r NaN
}

// log(x) = e ln2 + log(m) with x = m 2^e, m in [sqrt(1/2), sqrt(2)); with
// f = m - 1 and s = f / (2 + f), log(m) = 2 atanh(s) = f - f^2/2 + s (f^2/2 + R(s^2)),
// arranged so that the large term f enters last and exactly.
inline FloatVector log(FloatVector x) {
  using namespace kernel;
  // Subnormals are scaled into the normal range by 2^23, taken off e again.
  const FloatMask subnormal = x < FloatVector(std::numeric_limits<float>::min());
  const FloatVector normal = select(subnormal, x * FloatVector(8388608.0f), x);
  FloatVector e = exponent_of(normal) - select(subnormal, FloatVector(23.0f), FloatVector(0.0f));
  FloatVector m = significand_of(normal);
  const FloatMask above_sqrt2 = FloatVector(1.41421356f) < m;
  m = select(above_sqrt2, m * FloatVector(0.5f), m);
  e = select(above_sqrt2, e + FloatVector(1.0f), e);

  const FloatVector f = m - FloatVector(1.0f);
  const FloatVector s = f / (FloatVector(2.0f) + f);
  const FloatVector z = s * s;
  const FloatVector half_f_squared = FloatVector(0.5f) * f * f;
  const FloatVector r = z * polynomial(z, kLog);
  const FloatVector log_m_minus_f = fma(s, half_f_squared + r, e * FloatVector(kLn2Low)) - half_f_squared;
  const FloatVector result = fma(e, FloatVector(kLn2High), log_m_minus_f + f);

  const float infinity = std::numeric_limits<float>::infinity();
  FloatVector special = select(x == FloatVector(0.0f), FloatVector(-infinity), result);
  special = select(x < FloatVector(0.0f), FloatVector(std::numeric_limits<float>::quiet_NaN()), special);
  special = select(x == FloatVector(infinity), x, special);
  return select(is_nan(x), x, special);
}

// tanh is odd: computed for a = |x|, the sign copied back (so -0 stays -0).
// tanh(a) = a + a^3 P(a^2) for a < 0.625 (exact for tiny a), else
// 1 - 2 / (exp(2a) + 1), which reaches 1 when exp overflows.
inline FloatVector tanh(FloatVector x) {
  using namespace kernel;
  const FloatVector a = abs(x);
  const FloatVector z = a * a;
  const FloatVector small = fma(a * z, polynomial(z, kTanh), a);
  const FloatVector large = FloatVector(1.0f) - FloatVector(2.0f) / (exp(a + a) + FloatVector(1.0f));
  return copysign(select(a < FloatVector(0.625f), small, large), x);
}

// erf(x) = x + x P(x^2) for |x| < 1 (the leading x exact, -0 kept); beyond,
// erf|x| = 1 - exp(-x^2) erfcx(|x|), erfcx(t) = exp(t^2) erfc(t) being smooth
// and slowly varying. From 3.95 on (erfc < 2^-25), erf rounds to 1, so |x| is
// clamped there.
inline FloatVector erf(FloatVector x) {
  using namespace kernel;
  const FloatVector small = fma(x, polynomial(x * x, kErf), x);
  const FloatVector a = clamp(abs(x), FloatVector(1.0f), FloatVector(3.95f));
  const FloatVector tail = FloatVector(1.0f) - exp(-(a * a)) * polynomial(a - FloatVector(2.5f), kErfcx);
  return select(abs(x) < FloatVector(1.0f), small, copysign(tail, x));
}

inline double exp(double x) { return std::exp(x); }
inline double log(double x) { return std::log(x); }
inline double tanh(double x) { return std::tanh(x); }
inline double erf(double x) { return std::erf(x); }

// 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below: exp never overflows,
// and tiny results keep their digits down into the subnormals.
inline double sigmoid(double x) {
  const double e = std::exp(-std::abs(x));
  return x < 0.0 ? e / (1.0 + e) : 1.0 / (1.0 + e);
}

// The f32 version divides by 1 + e exactly: with s = 1 + e rounded and
// t = (1 - s) + e its rounding error (exact, as e <= 1), a quotient q ~ n / s
// is corrected by the exact remainder of the division: n / (s + t) ~
// q + (n - q s - q t) / s. What remains is exp's error and one rounding.
inline FloatVector sigmoid(FloatVector x) {
  const FloatVector one(1.0f);
  const FloatVector e = exp(-abs(x));
  const FloatVector s = one + e;
  const FloatVector t = (one - s) + e;
  const FloatVector reciprocal = one / s;
  const FloatVector numerator = select(x < FloatVector(0.0f), e, one);
  const FloatVector q = numerator * reciprocal;
  const FloatVector remainder = fma(-q, t, fma(-q, s, numerator));
  return fma(remainder, reciprocal, q);
}

// out[i] = exp(x[i] - shift) over n contiguous values (softmax, attention).
template <typename T>
void exp_shifted(T* out, const T* x, int64_t n, T shift) {
  map_vectors(out, x, n, [shift](auto v) { return exp(v - decltype(v)(shift)); });
}

}  // namespace tessera::cpu::vec
