// nn::init: parameter initialisers drawing from Philox, so element i of a
// logical tensor depends only on (key, i). A slice of rows can therefore be
// initialised alone with exactly the bits the whole tensor would have had:
// FSDP initialises each rank's dim-0 shard without materialising the rest.
//
// Every function fills in place without recording autograd history and does
// nothing on meta tensors (beyond checking shapes). Keys normally come from
// InitContext::key(name) (nn/module.h): {model seed, stream_id_for(fqn)}.
#pragma once

#include <cstdint>
#include <utility>

#include "nn/parameter.h"
#include "tensor/philox.h"
#include "tensor/tensor.h"

namespace tessera::nn::init {

// Which part of a logical tensor a local tensor holds: the rows
// [row_offset, row_offset + local.size(0)) of dim 0 of `global_shape`, the
// other dims whole. An empty global_shape means "the local tensor is the
// whole". Fan-in/fan-out are computed from the global shape.
struct RowSlice {
  Shape global_shape;
  int64_t row_offset = 0;
};

enum class FanMode { fan_in, fan_out };

void normal_(Tensor& tensor, PhiloxKey key, double mean, double std, const RowSlice& slice = {});
void uniform_(Tensor& tensor, PhiloxKey key, double low, double high, const RowSlice& slice = {});
void constant_(Tensor& tensor, double value);
void zeros_(Tensor& tensor);
void ones_(Tensor& tensor);
// Glorot: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
void xavier_uniform_(Tensor& tensor, PhiloxKey key, double gain = 1.0, const RowSlice& slice = {});
// Glorot: N(0, gain * sqrt(2 / (fan_in + fan_out))).
void xavier_normal_(Tensor& tensor, PhiloxKey key, double gain = 1.0, const RowSlice& slice = {});
// He, for leaky_relu with negative slope `a` (a = 0: relu):
// std = sqrt(2 / (1 + a^2)) / sqrt(fan); uniform bound = sqrt(3) * std.
void kaiming_uniform_(Tensor& tensor, PhiloxKey key, double a = 0.0, FanMode mode = FanMode::fan_in,
                      const RowSlice& slice = {});
void kaiming_normal_(Tensor& tensor, PhiloxKey key, double a = 0.0, FanMode mode = FanMode::fan_in,
                     const RowSlice& slice = {});

// (fan_in, fan_out) of a weight shape: [out, in, *receptive]; needs dim >= 2.
std::pair<int64_t, int64_t> fans(const Shape& shape);

// The same on a Parameter's tensor. This is the one place that knows which
// slice of the global tensor a parameter holds: the whole, or for a sharded
// parameter the rows its ShardingSpec names.
void normal_(Parameter& parameter, PhiloxKey key, double mean, double std);
void uniform_(Parameter& parameter, PhiloxKey key, double low, double high);
void zeros_(Parameter& parameter);
void ones_(Parameter& parameter);
// Zeros the global rows [begin, end) of dim 0, those of them the parameter holds.
void zero_rows_(Parameter& parameter, int64_t begin, int64_t end);
void kaiming_uniform_(Parameter& parameter, PhiloxKey key, double a = 0.0, FanMode mode = FanMode::fan_in);

// A fresh 64-bit init seed drawn from this thread's default generator (one
// key consumed): what modules built directly on a real device use, so that
// tessera::manual_seed(s) makes construction reproducible.
uint64_t next_seed();

}  // namespace tessera::nn::init
