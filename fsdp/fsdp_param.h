// fsdp::FSDPParam: one original parameter under FSDP. It owns the three faces
// of the parameter and swaps which one the nn::Parameter holds:
//   sharded    - this rank's dim-0 rows of the global tensor in the original
//                dtype, in a buffer padded to ceil(rows / S) rows (ShardingSpec);
//                what the optimizer steps and where the sharded gradient lives;
//                in host memory under CPU offload (ShardMemory);
//   unsharded  - the whole tensor in param_dtype: one leaf tensor that lives
//                for the module's lifetime (autograd saves it in forward),
//                whose bytes are allocated by unshard and released by reshard;
//   its rows of a flat per-rank chunk, for the group's collectives (the
//   layout is the group's: fsdp/param_group.h).
//
// Internal to the fsdp layer (not installed: tools/install_headers.py).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dist/dtensor.h"
#include "nn/parameter.h"

namespace tessera::fsdp {

// FSDP's dim-0 split, one formula for fully_shard (FSDPParam, below) and for
// the sharding plan (fsdp/plan.h), which sizes shards for any world without
// a process group: over `shards` ranks every rank's shard is a chunk of
// ceil(rows / shards) rows, the real rows first and zero rows padding the
// tail (shard i holds rows dist::shard_extent(rows, shards, i)). Throws
// tessera::Error unless rows >= 0 and shards >= 1.
int64_t padded_shard_rows(int64_t rows, int64_t shards);

class FSDPParam {
 public:
  // Shards `param` over `mesh` (1-D: Shard(0); 2-D: Replicate, Shard(0)):
  // the Parameter is left holding this rank's padded shard (on meta when it
  // was on meta: no bytes allocated), in host memory unless `memory` is
  // ShardMemory::device.
  FSDPParam(std::string fqn, std::shared_ptr<nn::Parameter> param, const dist::DeviceMesh& mesh,
            nn::ShardMemory memory = nn::ShardMemory::device);

  const std::string& fqn() const { return fqn_; }
  void set_fqn(std::string fqn) { fqn_ = std::move(fqn); }
  nn::Parameter& param() const { return *param_; }
  const std::shared_ptr<nn::Parameter>& param_ptr() const { return param_; }
  const std::shared_ptr<const nn::ShardingSpec>& spec() const { return spec_; }

  const Shape& global_shape() const { return spec_->global_shape; }
  int64_t rows() const { return spec_->global_shape[0]; }
  int64_t row_numel() const { return row_numel_; }  // elements per dim-0 row
  int64_t padded_rows() const { return spec_->padded_rows; }  // rows of every rank's chunk: padded_shard_rows
  int64_t local_rows() const;
  DType dtype() const { return dtype_; }  // the original (sharded) dtype
  // Whether the shard lives in host memory (CPU offload) whatever device computes.
  bool offloaded() const { return spec_->memory != nn::ShardMemory::device; }

  // The shard whether or not the Parameter holds it now.
  const Tensor& sharded() const;
  // The shard with its zero padding rows: the whole padded buffer.
  Tensor padded_sharded() const;
  dist::DTensor sharded_dtensor() const;
  // The unsharded leaf (created by init_unsharded; its bytes may be released).
  const Tensor& unsharded() const { return unsharded_; }
  bool holds_unsharded() const { return holds_unsharded_; }

  // Creates the unsharded leaf in `param_dtype` on `device` (the shard's, or
  // the computing device under offload) with released storage (at the root's
  // lazy init, once the parameters live on a real device).
  void init_unsharded(DType param_dtype, Device device);
  bool has_unsharded() const { return unsharded_.defined(); }
  // Allocates the unsharded bytes (charged to the current memory scope).
  void alloc_unsharded();
  // The Parameter holds the unsharded leaf / the shard.
  void to_unsharded();
  void to_sharded();
  // Frees the unsharded bytes (the leaf and its .grad stay).
  void free_unsharded();

 private:
  std::string fqn_;
  std::shared_ptr<nn::Parameter> param_;
  std::shared_ptr<const nn::ShardingSpec> spec_;
  int64_t row_numel_ = 1;
  DType dtype_;
  Tensor sharded_;  // kept while the Parameter holds the unsharded leaf
  Tensor unsharded_;
  bool holds_unsharded_ = false;
};

}  // namespace tessera::fsdp
