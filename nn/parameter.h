// nn::Parameter: a trainable leaf tensor held in a module's registry slot.
// Layers read the tensor through the Parameter at every forward, so whoever
// owns the slot (FSDP: sharded <-> unsharded; to_empty) can swap it unseen.
//
// A Parameter may hold a piece of a larger logical tensor, split in two ways:
// - tensor parallelism (tp's styles) gives each rank of a tp mesh its box of
//   the logical tensor (TensorParallelSpec: Replicate, or Shard(d), with the
//   sections of a fused projection);
// - FSDP gives each rank a dim-0 shard of what it would otherwise hold
//   (ShardingSpec: the rows, over which mesh, the padded local storage).
// Init, to_empty, clip_grad_norm_ and state dicts read the specs, so they
// work on pieces.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/hooks.h"
#include "dist/dtensor.h"
#include "nn/all_gather_extension.h"
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

// How tensor parallelism laid a parameter out over a 1-D tp mesh. Shard(d):
// dim d of the logical tensor is `sections` equal parts (GPT's fused qkv is
// q, k and v stacked on dim 0: 3 sections; a plain weight: 1), each part
// ceil-chunked over the mesh (dist::shard_extent); a rank holds its chunk of
// every part, concatenated in order, the other dims whole. Replicate: every
// rank holds the whole tensor.
//
// A replicated parameter that meets sequence-sharded activations (a norm's
// weight and bias under sequence parallelism, a row-wise bias) gets only its
// sequence slice's share of the gradient on each rank: partial_gradient says
// that its gradients are summed over the tp group. The Parameter runs that
// sum (see sums_partial_gradient), so the ranks hold equal gradients.
struct TensorParallelSpec {
  dist::DeviceMesh mesh;  // 1-D
  dist::Placement placement = dist::Replicate{};
  Shape global_shape;
  int64_t sections = 1;
  bool partial_gradient = false;

  // The sharded dim, or -1 when replicated.
  int64_t shard_dim() const;
  // Along shard_dim(), the [offset, offset + length) boxes of the logical
  // tensor that tp rank `rank` holds, in the order its local tensor stacks
  // them (one box when replicated: the whole dim 0).
  std::vector<dist::ShardExtent> boxes(int64_t rank) const;
  // The shape of the local tensor of tp rank `rank`.
  Shape local_shape(int64_t rank) const;
  // Where rows [first_row, first_row + rows) of tp rank `rank`'s piece (FSDP's
  // shard of it, or all of it) sit along the logical tensor's dim 0: runs of
  // consecutive rows, one unless dim 0 is sharded (a run per box met).
  struct RowRun {
    int64_t piece_row;
    int64_t count;
    int64_t logical_row;
  };
  std::vector<RowRun> logical_rows(int64_t first_row, int64_t rows, int64_t rank) const;
  // "Shard(0) of [2304, 768] in 3 sections over tp (2 ranks)".
  std::string to_string() const;
  // The whole tensor from this rank's piece `local` (a parameter's, or its
  // gradient's): collective over the tp mesh; a copy when replicated.
  Tensor gather(const Tensor& local) const;
};

// Owned by shared_ptr: the same Parameter object registered in two modules is
// a tied parameter (one tensor, one gradient, listed once by named_parameters).
class Parameter {
 public:
  // `tensor` must be a leaf; requires_grad is applied to it (floating types only).
  explicit Parameter(Tensor tensor, bool requires_grad = true);

  const Tensor& tensor() const { return tensor_; }
  Tensor& tensor() { return tensor_; }
  // Replaces the tensor behind the parameter (a leaf); the requires_grad flag
  // is carried over to the new tensor. The tensor is taken as unsharded by
  // FSDP: the sharding spec is cleared (a tensor-parallel parameter takes
  // only its piece's shape).
  void set_tensor(Tensor tensor);
  // Replaces the tensor with a shard laid out as `sharding` says (its shape
  // must be the rows the spec gives this rank).
  void set_tensor(Tensor tensor, std::shared_ptr<const ShardingSpec> sharding);
  // Makes the parameter this rank's tensor-parallel piece: `local` (a leaf of
  // the shape the spec gives this rank of its mesh) replaces the tensor.
  // Once set, the spec stays for the parameter's life (FSDP shards the piece
  // further; set_tensor(Tensor) must keep the piece's shape).
  void set_tensor_parallel(Tensor local, std::shared_ptr<const TensorParallelSpec> spec);

  // With partial gradients (TensorParallelSpec::partial_gradient), whether
  // the Parameter sums each gradient over the tp group as it arrives (a
  // gradient hook; on by default). FSDP turns it off for the parameters it
  // shards and sums their reduce-scattered shards instead (1/dp of the
  // bytes); off otherwise, each rank keeps its partial gradient: the switch
  // a test flips to prove the sum matters.
  void set_sums_partial_gradient(bool sums);
  bool sums_partial_gradient() const { return partial_gradient_sum_.has_value(); }

  bool requires_grad() const { return requires_grad_; }
  // Freezes (false) or thaws the parameter: its tensor stops or starts
  // wanting gradients, and a frozen one's gradient is dropped. Before
  // fully_shard: FSDP lays out its gradient slots by this flag (a frozen
  // parameter gets none), so a sharded parameter refuses a change.
  void set_requires_grad(bool requires_grad);
  const Tensor& grad() const { return tensor_.grad(); }
  const Shape& sizes() const { return tensor_.sizes(); }
  int64_t numel() const { return tensor_.numel(); }

  // The layout of the tensor held now; null when it is the whole tensor.
  const std::shared_ptr<const ShardingSpec>& sharding() const { return sharding_; }
  bool is_sharded() const { return sharding_ != nullptr; }
  // A gradient hook that belongs to the parameter rather than to one tensor:
  // it sees (and may replace) the gradient reaching whichever tensor the
  // parameter holds, before accumulation, being registered on the current
  // tensor and on every tensor set later. Tensor parallelism sums partial
  // gradients over its group this way, so that to_empty and FSDP's swaps of
  // the tensor keep the sum. The handle removes it.
  autograd::HookHandle register_gradient_hook(GradHook hook);

  // The tensor-parallel layout; null when tensor parallelism did not touch
  // the parameter.
  const std::shared_ptr<const TensorParallelSpec>& tensor_parallel() const { return tensor_parallel_; }

  // What FSDP's all-gather moves for this parameter (nn/all_gather_extension.h);
  // null: the shard as it is, in param_dtype. Set before fully_shard.
  void set_all_gather_extension(std::shared_ptr<AllGatherExtension> extension) {
    all_gather_extension_ = std::move(extension);
  }
  const std::shared_ptr<AllGatherExtension>& all_gather_extension() const { return all_gather_extension_; }
  // The logical shape: the whole tensor's, whichever way it is split.
  const Shape& global_shape() const;
  // The held shard as a DTensor (no communication); throws when whole.
  dist::DTensor dtensor() const;

 private:
  // Checks and swaps the leaf, carrying requires_grad and the gradient hooks over.
  void replace_leaf(Tensor tensor);

  struct GradientHook {
    int64_t id;
    GradHook hook;
    autograd::HookHandle on_tensor;  // its registration on the tensor held now
  };

  Tensor tensor_;
  bool requires_grad_;
  std::shared_ptr<const ShardingSpec> sharding_;
  std::shared_ptr<const TensorParallelSpec> tensor_parallel_;
  std::shared_ptr<AllGatherExtension> all_gather_extension_;
  // Shared with the handles, which may outlive the parameter.
  std::shared_ptr<std::vector<GradientHook>> gradient_hooks_ = std::make_shared<std::vector<GradientHook>>();
  int64_t next_gradient_hook_id_ = 0;
  std::optional<autograd::HookHandle> partial_gradient_sum_;
};

}  // namespace tessera::nn
