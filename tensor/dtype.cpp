// DType properties, promotion, and IEEE half-precision conversion.
#include "tensor/dtype.h"

#include "tensor/error.h"

namespace tessera {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto dtype = static_cast<DType>(i);
    if (dtype_name(dtype) == name) return dtype;
  }
  fail("unknown dtype '{}' (expected f32, f64, bf16, f16, i32, i64 or bool)", name);
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16;
}

DType compute_dtype(DType dtype) {
  if (dtype == DType::bf16 || dtype == DType::f16) return DType::f32;
  return dtype;
}

namespace {
int promotion_rank(DType dtype) {
  switch (dtype) {
    case DType::boolean: return 0;
    case DType::i32: return 1;
    case DType::i64: return 2;
    case DType::bf16: return 3;
    case DType::f16: return 3;
    case DType::f32: return 4;
    case DType::f64: return 5;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // bf16 with f16 has no exact common 16-bit type: meet in f32.
  if ((a == DType::bf16 && b == DType::f16) || (a == DType::f16 && b == DType::bf16)) return DType::f32;
  return promotion_rank(a) >= promotion_rank(b) ? a : b;
}

uint16_t Half::from_float(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
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
  uint32_t rebased = magnitude - 0x38000000u;
  const uint32_t rounding_bias = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding_bias) >> 13));
}

float Half::to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t word;
  if (exponent == 0x1f) {
    word = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;
  } else {
    // Subnormal half: normalise into an f32.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    word = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

}  // namespace tessera
