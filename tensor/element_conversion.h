// Element conversions, written once for the cpu kernels and the cuda kernels
// (host and device code), so a copy or cast gives the same bits on both
// devices: 16-bit floats through f32 (tensor/float16_bits.h), floats to
// integers saturating with NaN to 0 (a plain cast of an out-of-range value is
// undefined behaviour; u8 saturates to [0, 255]), integers to narrower ones
// wrapping (C++'s modular conversion), anything to bool as "not zero". Also the two
// element-level helpers both devices' kernels share.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/dtype.h"

namespace tessera {

template <typename T>
constexpr bool is_16_bit_float = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;
template <typename T>
constexpr bool is_8_bit_float = std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2>;
// The floats stored narrower than f32 and computed in it.
template <typename T>
constexpr bool is_narrow_float = is_16_bit_float<T> || is_8_bit_float<T>;

template <typename To, typename From>
TESSERA_HOST_DEVICE To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return convert<To>(float16_bits::float_from_bfloat16(value.bits));
  } else if constexpr (std::is_same_v<From, Half>) {
    return convert<To>(float16_bits::float_from_half(value.bits));
  } else if constexpr (std::is_same_v<From, Float8E4M3>) {
    return convert<To>(float8_bits::float_from_code(value.bits, float8_bits::e4m3()));
  } else if constexpr (std::is_same_v<From, Float8E5M2>) {
    return convert<To>(float8_bits::float_from_code(value.bits, float8_bits::e5m2()));
  } else if constexpr (std::is_same_v<To, Float8E4M3>) {
    Float8E4M3 result;
    result.bits = float8_bits::code_from_float(static_cast<float>(value), float8_bits::e4m3());
    return result;
  } else if constexpr (std::is_same_v<To, Float8E5M2>) {
    Float8E5M2 result;
    result.bits = float8_bits::code_from_float(static_cast<float>(value), float8_bits::e5m2());
    return result;
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    BFloat16 result;
    result.bits = float16_bits::bfloat16_from_float(static_cast<float>(value));
    return result;
  } else if constexpr (std::is_same_v<To, Half>) {
    Half result;
    result.bits = float16_bits::half_from_float(static_cast<float>(value));
    return result;
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_unsigned_v<To> && std::is_floating_point_v<From>) {
    constexpr auto limit = static_cast<From>(uint64_t{1} << (8 * sizeof(To)));  // 2^bits, exact
    if (value != value || value <= From(-1)) return To(0);  // (-1, 0) truncates to 0 too
    if (value >= limit) return std::numeric_limits<To>::max();
    return static_cast<To>(value);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    constexpr auto limit = static_cast<From>(uint64_t{1} << (8 * sizeof(To) - 1));  // 2^(bits-1), exact
    if (value != value) return To(0);
    if (value >= limit) return std::numeric_limits<To>::max();
    if (value < -limit) return std::numeric_limits<To>::min();
    return static_cast<To>(value);
  } else {
    return static_cast<To>(value);
  }
}

// The largest value of T below `value` (value finite): the random kernels
// step a uniform draw that rounded up to b back into [a, b).
template <typename T>
TESSERA_HOST_DEVICE T step_down(T value) {
  if constexpr (is_16_bit_float<T>) {
    T below = value;
    if ((value.bits & 0x7fffu) == 0) {
      below.bits = 0x8001u;  // from +-0 to the smallest negative subnormal
    } else if (value.bits & 0x8000u) {
      ++below.bits;
    } else {
      --below.bits;
    }
    return below;
  } else {
    return std::nextafter(value, -std::numeric_limits<T>::infinity());
  }
}

// a^b for integers by squaring, wrapping on overflow; a negative exponent
// truncates 1/a^|b| toward zero.
template <typename T>
TESSERA_HOST_DEVICE T integer_pow(T base, T exponent) {
  using U = std::make_unsigned_t<T>;
  if (exponent < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exponent & 1) ? T(-1) : T(1);
    return 0;
  }
  U result = 1, factor = static_cast<U>(base);
  for (auto e = static_cast<U>(exponent); e != 0; e >>= 1) {
    if (e & 1u) result *= factor;
    factor *= factor;
  }
  return static_cast<T>(result);
}

}  // namespace tessera
