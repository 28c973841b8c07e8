// FSDP's all-gather of an NF4 weight (tensor/nf4_format.h): the packed rows
// travel as they are stored, about 0.52 bytes a weight against 2 for bf16,
// and are dequantised into the unsharded weight after the gather.
//
// The packed weight [out, row_bytes] is sharded by rows like a dense one.
// FSDP pads each rank's rows to ceil(out / N) and gathers rank after rank,
// so the first `out` gathered rows are the whole packed weight in order
// (only the last ranks' tails are padding): post_all_gather dequantises
// those. Any world size works; no NF4 block is ever split.
#pragma once

#include "nn/all_gather_extension.h"

namespace tessera::nn {

class NF4AllGather final : public AllGatherExtension {
 public:
  explicit NF4AllGather(int64_t in_features);

  std::string name() const override { return "nf4"; }
  Shape unsharded_shape(const Shape& packed_shape) const override;
  DType unsharded_dtype(DType param_dtype) const override { return param_dtype; }
  AllGatherPayloads pre_all_gather(const Tensor& padded_shard, DType param_dtype) override;
  // The padded shard's bytes, as they are.
  std::vector<PayloadSize> payload_sizes(const Shape& padded_shard_shape, DType shard_dtype,
                                         DType param_dtype) const override;
  void post_all_gather(const std::vector<Tensor>& gathered, const std::shared_ptr<const void>& metadata,
                       const Tensor& unsharded) override;

 private:
  int64_t in_features_;
};

}  // namespace tessera::nn
