// The NF4 weight's all-gather: packed rows out, dequantised rows back.
#include "nn/nf4_all_gather.h"

#include "tensor/ops.h"

namespace tessera::nn {

NF4AllGather::NF4AllGather(int64_t in_features) : in_features_(in_features) {
  TESSERA_CHECK(in_features > 0, "NF4AllGather: rows need at least one element, got {}", in_features);
}

Shape NF4AllGather::unsharded_shape(const Shape& packed_shape) const {
  TESSERA_CHECK(packed_shape.size() == 2 && packed_shape[1] == ops::nf4_row_bytes(in_features_),
                "NF4AllGather: a weight of rows of {} packs into [rows, {}], got {}", in_features_,
                ops::nf4_row_bytes(in_features_), packed_shape);
  return {packed_shape[0], in_features_};
}

AllGatherPayloads NF4AllGather::pre_all_gather(const Tensor& padded_shard, DType) {
  TESSERA_CHECK(padded_shard.dtype() == DType::u8, "NF4AllGather: the shard must be packed NF4 rows (u8), got {}",
                dtype_name(padded_shard.dtype()));
  return {{padded_shard}, nullptr};
}

std::vector<PayloadSize> NF4AllGather::payload_sizes(const Shape& padded_shard_shape, DType shard_dtype,
                                                     DType) const {
  TESSERA_CHECK(shard_dtype == DType::u8, "NF4AllGather: the shard must be packed NF4 rows (u8), got {}",
                dtype_name(shard_dtype));
  return {{DType::u8, shape_numel(padded_shard_shape)}};
}

void NF4AllGather::post_all_gather(const std::vector<Tensor>& gathered, const std::shared_ptr<const void>&,
                                   const Tensor& unsharded) {
  const int64_t rows = unsharded.size(0);
  const int64_t row_bytes = ops::nf4_row_bytes(in_features_);
  TESSERA_CHECK(gathered.size() == 1 && gathered[0].numel() >= rows * row_bytes,
                "NF4AllGather: expected one gathered payload of at least {} rows of {} bytes", rows, row_bytes);
  const Tensor packed = ops::view(ops::narrow(gathered[0], 0, 0, rows * row_bytes), {rows, row_bytes});
  Tensor target = unsharded;  // straight into the unsharded weight: no dense temporary beside it
  ops::nf4_dequantize_into(target, packed);
}

}  // namespace tessera::nn
