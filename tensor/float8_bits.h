// Bit-exact conversions between f32 and the 8-bit floats of FP8 training,
// written once for the cpu kernels and the cuda kernels (host and device):
//   e4m3  1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, one NaN
//         per sign (S.1111.111); largest finite 448;
//   e5m2  1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-style
//         infinities and NaNs; largest finite 57344.
// From f32: round to nearest, ties to even, and saturate as the hardware's
// satfinite conversion (PTX cvt.rn.satfinite.e4m3x2/e5m2x2.f32) does: a
// finite value past the largest, or an infinity, becomes the largest finite
// value of its sign; NaN becomes 0x7f (a NaN in both formats). To f32: exact.
// tests/tensor/test_float8.cpp checks all 256 codes of each against tables
// from ml_dtypes (tests/oracle/float8_oracle.py).
#pragma once

#include <cstdint>

#include "tensor/float16_bits.h"
#include "tensor/host_device.h"

namespace tessera::float8_bits {

// One format's constants: exponent bits, mantissa bits, the largest finite
// code (without the sign).
struct Format {
  int exponent_bits;
  int mantissa_bits;
  uint32_t max_finite_code;
  bool has_infinity;
};
// Functions, not variables: device code may call them (it cannot read a
// host variable).
TESSERA_HOST_DEVICE constexpr Format e4m3() { return {4, 3, 0x7e, false}; }
TESSERA_HOST_DEVICE constexpr Format e5m2() { return {5, 2, 0x7b, true}; }

TESSERA_HOST_DEVICE inline float float_from_code(uint8_t code, Format format) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const int mantissa_bits = format.mantissa_bits;
  const uint32_t exponent_field = (code & 0x7fu) >> mantissa_bits;
  const uint32_t mantissa = code & ((1u << mantissa_bits) - 1u);
  const uint32_t top_exponent = (1u << format.exponent_bits) - 1u;
  const int bias = (1 << (format.exponent_bits - 1)) - 1;
  if (format.has_infinity && exponent_field == top_exponent) {
    return float16_bits::float_of(sign | 0x7f800000u | (mantissa != 0 ? 0x400000u : 0u));
  }
  if (!format.has_infinity && (code & 0x7fu) == 0x7fu) return float16_bits::float_of(sign | 0x7fc00000u);
  if (exponent_field == 0) {
    if (mantissa == 0) return float16_bits::float_of(sign);
    // Subnormal: mantissa x 2^(1 - bias - M), normalised into an f32.
    int exponent = 1 - bias - mantissa_bits;
    uint32_t significand = mantissa;
    while (significand < (1u << mantissa_bits)) {
      significand <<= 1;
      --exponent;
    }
    const uint32_t f32_exponent = static_cast<uint32_t>(exponent + mantissa_bits + 127);
    return float16_bits::float_of(sign | (f32_exponent << 23) |
                                  ((significand & ((1u << mantissa_bits) - 1u)) << (23 - mantissa_bits)));
  }
  const uint32_t f32_exponent = exponent_field - static_cast<uint32_t>(bias) + 127u;
  return float16_bits::float_of(sign | (f32_exponent << 23) | (mantissa << (23 - mantissa_bits)));
}

TESSERA_HOST_DEVICE inline uint8_t code_from_float(float value, Format format) {
  const uint32_t word = float16_bits::bits_of(value);
  const uint32_t sign = (word >> 24) & 0x80u;
  const uint32_t magnitude = word & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7f;  // NaN
  const auto saturated = static_cast<uint8_t>(sign | format.max_finite_code);
  if (magnitude == 0x7f800000u) return saturated;
  const int f32_exponent = static_cast<int>(magnitude >> 23);
  if (f32_exponent == 0) return static_cast<uint8_t>(sign);  // f32 subnormals are far below half the least code
  const int mantissa_bits = format.mantissa_bits;
  const int bias = (1 << (format.exponent_bits - 1)) - 1;
  const int exponent = f32_exponent - 127;
  if (exponent > (1 << format.exponent_bits) - bias) return saturated;  // at least twice the largest
  // The value is significand x 2^(exponent - 23); count it in quanta of the
  // target binade, 2^(target - M), target no lower than the least normal one.
  const uint64_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const int target = exponent > 1 - bias ? exponent : 1 - bias;
  const int shift = 23 - mantissa_bits + target - exponent;
  uint64_t quanta = 0;
  if (shift < 40) {
    quanta = significand >> shift;
    const uint64_t remainder = significand & ((uint64_t{1} << shift) - 1u);
    const uint64_t halfway = uint64_t{1} << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (quanta & 1u))) ++quanta;
  }
  uint32_t code = 0;
  if (quanta < (uint64_t{1} << mantissa_bits)) {
    code = static_cast<uint32_t>(quanta);  // subnormal (target is the least normal binade) or zero
  } else {
    int exponent_field = target + bias;
    if (quanta == (uint64_t{1} << (mantissa_bits + 1))) {  // rounded up into the next binade
      quanta >>= 1;
      ++exponent_field;
    }
    if (exponent_field >= (1 << format.exponent_bits)) return saturated;
    code = (static_cast<uint32_t>(exponent_field) << mantissa_bits) |
           static_cast<uint32_t>(quanta - (uint64_t{1} << mantissa_bits));
  }
  if (code > format.max_finite_code) return saturated;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace tessera::float8_bits
