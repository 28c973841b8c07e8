// FSDP's all-gather of a float8-trained weight (torchao's float8 all-gather):
// each rank casts its shard to f8e4m3 at the weight's scale before the
// gather, so the gather moves 1 byte a weight, half of bf16's; after it the
// unsharded weight holds the float8 values unscaled, in param_dtype, and the
// layer's float8 product casts them back at the same scale to the same codes
// (a float8 value unscaled and scaled again stays within an f32 rounding of
// itself, far from any float8 rounding boundary).
//
// The scale must be the whole weight's, the same on every rank: it comes
// from the amax over every rank that holds a piece, which
// fsdp::precompute_float8_scales computes for every float8 weight at once
// (one all-reduce of all their amaxes). Whoever changes the weights (the
// optimizer step, a load) computes them again before the next forward: a
// stale scale would clip the weights that grew. A gather before any scale
// was computed is an error.
#pragma once

#include <memory>

#include "nn/all_gather_extension.h"

namespace tessera::nn {

// The scale a float8 weight is gathered and multiplied at: a 0-d f32 on the
// weight's device (undefined until computed), shared by the extension and
// the layer that multiplies with the weight.
struct Float8WeightScale {
  Tensor scale;
};

class Float8AllGather final : public AllGatherExtension {
 public:
  explicit Float8AllGather(std::shared_ptr<Float8WeightScale> scale);

  std::string name() const override { return "float8"; }
  AllGatherPayloads pre_all_gather(const Tensor& padded_shard, DType param_dtype) override;
  std::vector<PayloadSize> payload_sizes(const Shape& padded_shard_shape, DType shard_dtype,
                                         DType param_dtype) const override;
  void post_all_gather(const std::vector<Tensor>& gathered, const std::shared_ptr<const void>& metadata,
                       const Tensor& unsharded) override;
  const std::shared_ptr<Float8WeightScale>& scale() const { return scale_; }

 private:
  std::shared_ptr<Float8WeightScale> scale_;
};

}  // namespace tessera::nn
