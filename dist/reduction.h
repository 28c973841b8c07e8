// The reduction kernel every backend shares: the contract of ReduceOp in one
// place. Contributions are combined in the order given (rank order when the
// caller passes ranks 0..N-1), accumulated in f32 for bf16/f16 (f64 for f64,
// i64 for integers), divided once for AVG and rounded once into `dtype`.
#pragma once

#include <cstdint>
#include <span>

#include "dist/reduce_op.h"
#include "tensor/dtype.h"

namespace tessera::dist {

// out[i] = op(inputs[0][i], inputs[1][i], ...) for i in [0, count); `out` may
// alias one of the inputs. `group_size` is the divisor of AVG.
void reduce_in_order(void* out, std::span<const void* const> inputs, int64_t count, DType dtype, ReduceOp op,
                     int group_size);

// inout[i] = op(inout[i], in[i]) with the same accumulation and one rounding
// per call (no AVG division: callers divide once at the end with finish_average).
void combine_into(void* inout, const void* in, int64_t count, DType dtype, ReduceOp op);
// data[i] /= group_size, in the accumulation type, rounded once.
void finish_average(void* data, int64_t count, DType dtype, int group_size);

}  // namespace tessera::dist
