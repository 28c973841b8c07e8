// The reductions' accumulators, identities and combine steps, written once
// for the cpu kernels and the cuda kernels (host and device code): sums of
// floats accumulate in f64, of integers in i64 (wrapping); max and min
// propagate NaN (a NaN anywhere makes the result NaN) and compare 16-bit
// floats as the f32 values they are exactly.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/element_conversion.h"
#include "tensor/host_device.h"

namespace tessera {

template <typename T>
struct SumOp {
  using Acc = std::conditional_t<std::is_floating_point_v<T> || is_narrow_float<T>, double, int64_t>;
  TESSERA_HOST_DEVICE static Acc identity() { return Acc(0); }
  TESSERA_HOST_DEVICE static Acc load(T value) { return convert<Acc>(value); }
  TESSERA_HOST_DEVICE static Acc combine(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<Acc>) {
      return a + b;
    } else {
      return static_cast<Acc>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    }
  }
};

// The type max and min work in: f32 for 16- and 8-bit floats, else T.
template <typename T>
using ExtremumValue = std::conditional_t<is_narrow_float<T>, float, T>;

template <typename T>
struct MaxOp {
  using Acc = ExtremumValue<T>;
  TESSERA_HOST_DEVICE static Acc identity() {
    if constexpr (std::is_floating_point_v<Acc>) return -std::numeric_limits<Acc>::infinity();
    return std::numeric_limits<Acc>::lowest();
  }
  TESSERA_HOST_DEVICE static Acc load(T value) { return convert<Acc>(value); }
  TESSERA_HOST_DEVICE static Acc combine(Acc a, Acc b) { return (a != a || a > b) ? a : b; }
};

template <typename T>
struct MinOp {
  using Acc = ExtremumValue<T>;
  TESSERA_HOST_DEVICE static Acc identity() {
    if constexpr (std::is_floating_point_v<Acc>) return std::numeric_limits<Acc>::infinity();
    return std::numeric_limits<Acc>::max();
  }
  TESSERA_HOST_DEVICE static Acc load(T value) { return convert<Acc>(value); }
  TESSERA_HOST_DEVICE static Acc combine(Acc a, Acc b) { return (a != a || a < b) ? a : b; }
};

}  // namespace tessera
