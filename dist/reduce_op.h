// The reductions a collective can apply. AVG is exact on every backend: the
// contributions are summed (in f32 for bf16/f16, f64 for f64, i64 for
// integers), then divided once by the group size, then rounded once into the
// tensor's dtype. Integer AVG divides with truncation toward zero.
#pragma once

#include <cstdint>
#include <string_view>

namespace tessera::dist {

enum class ReduceOp : uint8_t { sum, avg, max, min };

std::string_view reduce_op_name(ReduceOp op);

}  // namespace tessera::dist
