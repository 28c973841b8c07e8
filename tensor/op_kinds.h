// The kinds of elementwise, reduction and random ops the kernel tables
// implement: plain enums, shared by the cpu kernels and the cuda kernel
// sources (which nvcc compiles without the rest of tensor/).
#pragma once

#include <cstdint>

namespace tessera {

enum class UnaryOp : uint8_t {
  neg, exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu, gelu_tanh, gelu_erf, silu, logical_not
};

enum class BinaryOp : uint8_t {
  add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge
};

enum class ReduceOp : uint8_t { sum, max, min };

enum class RandomDistribution : uint8_t { uniform, normal };

}  // namespace tessera
