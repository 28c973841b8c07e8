// Bit-exact conversions between f32 and the 16-bit floats (bf16, IEEE f16),
// round to nearest even, written once for the cpu kernels and the cuda
// kernels (host and device code alike), so that a conversion gives the same
// bits on every device, NaN payloads included.
#pragma once

#include <cstdint>
#include <cstring>

#include "tensor/host_device.h"

namespace tessera::float16_bits {

TESSERA_HOST_DEVICE inline uint32_t bits_of(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  return word;
}

TESSERA_HOST_DEVICE inline float float_of(uint32_t word) {
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// bf16 is the top half of an f32.
TESSERA_HOST_DEVICE inline uint16_t bfloat16_from_float(float value) {
  const uint32_t word = bits_of(value);
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding_bias = 0x7fffu + ((word >> 16) & 1u);  // ties to even
  return static_cast<uint16_t>((word + rounding_bias) >> 16);
}

TESSERA_HOST_DEVICE inline float float_from_bfloat16(uint16_t bits) { return float_of(static_cast<uint32_t>(bits) << 16); }

TESSERA_HOST_DEVICE inline uint16_t half_from_float(float value) {
  const uint32_t word = bits_of(value);
  const uint32_t sign = (word >> 16) & 0x8000u;
  const uint32_t magnitude = word & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow rounds to inf
  if (magnitude < 0x38800000u) {
    // Subnormal half (or zero): shift the implicit-one mantissa into place, round to even.
    if (magnitude < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const int exponent = static_cast<int>(magnitude >> 23);
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const int shift = 126 - exponent;  // 14 + (113 - exponent) - 1
    const uint32_t half_bits = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t result = half_bits;
    if (remainder > halfway || (remainder == halfway && (half_bits & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to even.
  const uint32_t rebased = magnitude - 0x38000000u;
  const uint32_t rounding_bias = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding_bias) >> 13));
}

TESSERA_HOST_DEVICE inline float float_from_half(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return float_of(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return float_of(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return float_of(sign);
  // Subnormal half: normalise into an f32.
  uint32_t shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  mantissa &= 0x3ffu;
  return float_of(sign | ((113 - shift) << 23) | (mantissa << 13));
}

}  // namespace tessera::float16_bits
