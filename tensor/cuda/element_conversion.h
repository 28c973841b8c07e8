// Element conversions in cuda kernels, exactly the cpu kernels' rules, so a
// copy or cast gives the same bits on both devices: 16-bit floats through
// f32 (tensor/float16_bits.h), floats to integers saturating with NaN to 0,
// anything to bool as "not zero".
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/dtype.h"

namespace tessera::cuda {

template <typename T>
constexpr bool is_16_bit_float = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

template <typename To, typename From>
TESSERA_HOST_DEVICE To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return convert<To>(float16_bits::float_from_bfloat16(value.bits));
  } else if constexpr (std::is_same_v<From, Half>) {
    return convert<To>(float16_bits::float_from_half(value.bits));
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

}  // namespace tessera::cuda
