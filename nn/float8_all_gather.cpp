// The float8 weight's all-gather: f8e4m3 codes out, unscaled values back.
#include "nn/float8_all_gather.h"

#include "tensor/ops.h"

namespace tessera::nn {

Float8AllGather::Float8AllGather(std::shared_ptr<Float8WeightScale> scale) : scale_(std::move(scale)) {
  TESSERA_CHECK(scale_ != nullptr, "Float8AllGather: needs a scale holder");
}

AllGatherPayloads Float8AllGather::pre_all_gather(const Tensor& padded_shard, DType) {
  TESSERA_CHECK(scale_->scale.defined(),
                "Float8AllGather: the weight's float8 scale was never computed; call "
                "fsdp::precompute_float8_scales(root) after the weights are set and after each optimizer step");
  return {{ops::to_float8(padded_shard, scale_->scale, DType::f8e4m3)}, nullptr};
}

std::vector<PayloadSize> Float8AllGather::payload_sizes(const Shape& padded_shard_shape, DType, DType) const {
  return {{DType::f8e4m3, shape_numel(padded_shard_shape)}};
}

void Float8AllGather::post_all_gather(const std::vector<Tensor>& gathered, const std::shared_ptr<const void>&,
                                      const Tensor& unsharded) {
  TESSERA_CHECK(gathered.size() == 1 && gathered[0].numel() >= unsharded.numel(),
                "Float8AllGather: expected one gathered payload of at least {} codes", unsharded.numel());
  // The first rows gathered are the whole weight's (the padding ends the last ranks' shards).
  const Tensor codes = ops::view(ops::narrow(gathered[0], 0, 0, unsharded.numel()), unsharded.sizes());
  Tensor target = unsharded;
  ops::copy_(target, ops::div(ops::to(codes, DType::f32), scale_->scale));
}

}  // namespace tessera::nn
