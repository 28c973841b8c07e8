// FSDP's all-gather extension: what a parameter's all-gather moves when it is
// not the shard as it is. FSDP2 calls these fsdp_pre_all_gather and
// fsdp_post_all_gather; torchao gathers float8 weights with them, torchtune
// 4-bit NF4 ones.
//
//   pre_all_gather   this rank's padded shard -> payloads (any dtypes) and
//                    metadata, before the group's all-gather;
//   post_all_gather  every rank's payloads, gathered -> the unsharded
//                    parameter, after it.
//
// The group's all-gather then moves every parameter's payloads in one flat
// buffer (fsdp/param_group.h): of their dtype when all agree, of bytes (u8)
// when they differ. Before issuing it each rank checks that every rank's
// payloads have the same dtypes and sizes; a mismatch is an error naming the
// parameter and the ranks, never a hang.
//
// An extension whose unsharded parameter differs from the shard's shape or
// from the group's param_dtype (NF4's packed bytes dequantised into a matrix)
// is for a frozen parameter: its gradient would have no shard to go back to.
// Set on a Parameter (Parameter::set_all_gather_extension) before fully_shard.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tessera::nn {

// One payload's dtype and element count.
struct PayloadSize {
  DType dtype = DType::f32;
  int64_t numel = 0;
};

struct AllGatherPayloads {
  std::vector<Tensor> payloads;           // this rank's; FSDP flattens each (made contiguous)
  std::shared_ptr<const void> metadata;   // handed to post_all_gather as it is
};

class AllGatherExtension {
 public:
  virtual ~AllGatherExtension() = default;
  virtual std::string name() const = 0;

  // The unsharded parameter's shape and dtype, from the parameter's global
  // shape and the group's param_dtype; by default those.
  virtual Shape unsharded_shape(const Shape& global_shape) const { return global_shape; }
  virtual DType unsharded_dtype(DType param_dtype) const { return param_dtype; }

  // `padded_shard`: this rank's rows of the parameter in its own dtype,
  // padded with zero rows to the same row count on every rank (rows
  // dist::shard_extent says, then padding), on the group's device.
  virtual AllGatherPayloads pre_all_gather(const Tensor& padded_shard, DType param_dtype) = 0;
  // What pre_all_gather returns for a padded shard of this shape and dtype,
  // without running it: how a sharding plan (fsdp/plan.h) counts the
  // all-gather's bytes before any tensor exists. The default throws: an
  // extension that cannot say is gathered, but not planned.
  virtual std::vector<PayloadSize> payload_sizes(const Shape& padded_shard_shape, DType shard_dtype,
                                                 DType param_dtype) const;

  // `gathered[i]`: payload i of every rank, rank after rank, 1-D in its
  // dtype; `metadata`: this rank's from pre_all_gather. Writes every element
  // of `unsharded` (unsharded_shape, unsharded_dtype, contiguous).
  virtual void post_all_gather(const std::vector<Tensor>& gathered, const std::shared_ptr<const void>& metadata,
                               const Tensor& unsharded) = 0;
};

}  // namespace tessera::nn
