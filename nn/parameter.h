// nn::Parameter: a trainable leaf tensor held in a module's registry slot.
// Layers read the tensor through the Parameter at every forward, so whoever
// owns the slot (FSDP: sharded <-> unsharded; to_empty) can swap it unseen.
//
// A Parameter may hold a dim-0 shard of a larger logical tensor: its
// ShardingSpec then says where the rows sit (global shape, row offset), over
// which mesh, and how many rows the padded local storage has. Init, to_empty,
// clip_grad_norm_ and state dicts read the spec, so they work on shards.
#pragma once

#include <memory>

#include "dist/dtensor.h"
#include "tensor/tensor.h"

namespace tessera::nn {

// The layout of a dim-0 sharded parameter (FSDP's): the local tensor holds the
// global rows [row_offset, row_offset + local rows), the first rows of a
// contiguous buffer of padded_rows rows (ceil(rows / shards); the tail is zero
// padding, so every rank's buffer has the same size for the collectives).
//
// Where the padded buffer lives: on the module's device, or (fsdp's
// CPUOffloadPolicy) in host memory whatever device the module computes on,
// page-locked when pinned so that copies to the device run asynchronously.
enum class ShardMemory { device, host, pinned_host };

struct ShardingSpec {
  dist::DeviceMesh mesh;        // 1-D (shard), or 2-D (replicate, shard) for HSDP
  dist::Placements placements;  // per mesh dim: Shard(0) or Replicate()
  Shape global_shape;
  int64_t row_offset = 0;
  int64_t padded_rows = 0;
  ShardMemory memory = ShardMemory::device;

  // The groups whose ranks hold different rows (the mesh dims placed Shard).
  std::vector<dist::ProcessGroupPtr> shard_groups() const;
};

// An uninitialised padded shard buffer for a module materialised on
// `device`: there, or in host memory as `memory` says (meta stays meta).
Tensor padded_shard_buffer(const Shape& padded_shape, DType dtype, Device device, ShardMemory memory);

// Owned by shared_ptr: the same Parameter object registered in two modules is
// a tied parameter (one tensor, one gradient, listed once by named_parameters).
class Parameter {
 public:
  // `tensor` must be a leaf; requires_grad is applied to it (floating types only).
  explicit Parameter(Tensor tensor, bool requires_grad = true);

  const Tensor& tensor() const { return tensor_; }
  Tensor& tensor() { return tensor_; }
  // Replaces the tensor behind the parameter (a leaf); the requires_grad flag
  // is carried over to the new tensor. The tensor is taken as whole: the
  // sharding spec is cleared.
  void set_tensor(Tensor tensor);
  // Replaces the tensor with a shard laid out as `sharding` says (its shape
  // must be the rows the spec gives this rank).
  void set_tensor(Tensor tensor, std::shared_ptr<const ShardingSpec> sharding);

  bool requires_grad() const { return requires_grad_; }
  const Tensor& grad() const { return tensor_.grad(); }
  const Shape& sizes() const { return tensor_.sizes(); }
  int64_t numel() const { return tensor_.numel(); }

  // The layout of the tensor held now; null when it is the whole tensor.
  const std::shared_ptr<const ShardingSpec>& sharding() const { return sharding_; }
  bool is_sharded() const { return sharding_ != nullptr; }
  // The logical shape: the global one for a shard.
  const Shape& global_shape() const { return sharding_ ? sharding_->global_shape : tensor_.sizes(); }
  // The held shard as a DTensor (no communication); throws when whole.
  dist::DTensor dtensor() const;

 private:
  Tensor tensor_;
  bool requires_grad_;
  std::shared_ptr<const ShardingSpec> sharding_;
};

}  // namespace tessera::nn
