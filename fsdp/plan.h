// fsdp::ShardingPlan: what fully_shard does to a model, as numbers and as
// text, before a step runs. Per FSDP module its settings and, per parameter,
// the global shape, every rank's padded rows and the padding; per rank the
// parameter and gradient shards, the optimizer's state (as the caller sizes
// it) and the peak of unsharded parameters during a training step, with the
// groups that make it; and the bytes one step moves.
//
// A plan comes from one of two places, and both go through the same
// arithmetic:
//   plan_of(root)            a live FSDP model: its groups as fully_shard made
//                            them (allocated: the root's lazy init runs);
//   plan_fully_shard(calls)  the fully_shard calls a model would get, on a
//                            mesh given by its sizes alone: no process group,
//                            no rank, no allocation, so a model built on meta
//                            is planned over 1,024 ranks in milliseconds.
// The figures use FSDP's own dim-0 split (padded_shard_rows) and the volumes
// ProcessGroup::stats() counts (dist::collective_volume); tests hold plans to
// what real fully_shard runs allocate and send.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/fully_shard.h"
#include "fsdp/reshard_after_forward.h"
#include "nn/all_gather_extension.h"
#include "nn/module.h"
#include "tensor/dtype.h"

namespace tessera::fsdp {

// The collectives FSDP issues on one rank for one training step, summed over
// every group of the root's tree:
//   all-gather      one per group in forward, and one more in backward for
//                   groups that reshard after forward (over the group of N
//                   ranks when reshard_after_forward = N);
//   reduce-scatter  one per group with trainable parameters: their padded
//                   chunks plus one presence flag each, in reduce_dtype (a
//                   frozen parameter has no place in it);
//   all-reduce      HSDP only: that reduced slot again over the replicate group;
//   partial-gradient all-reduce
//                   under tensor parallelism: the reduced shards of the
//                   parameters with partial gradients (sequence-parallel
//                   norms, row-wise biases), packed, over the tp group.
struct StepCommVolume {
  int64_t all_gather_calls = 0;
  int64_t all_gather_bytes_sent = 0;
  int64_t all_gather_bytes_received = 0;
  int64_t reduce_scatter_calls = 0;
  int64_t reduce_scatter_bytes_sent = 0;
  int64_t reduce_scatter_bytes_received = 0;
  int64_t all_reduce_calls = 0;
  int64_t all_reduce_bytes_sent = 0;
  int64_t all_reduce_bytes_received = 0;
  int64_t partial_gradient_calls = 0;
  int64_t partial_gradient_bytes_sent = 0;
  int64_t partial_gradient_bytes_received = 0;

  int64_t total_sent() const {
    return all_gather_bytes_sent + reduce_scatter_bytes_sent + all_reduce_bytes_sent + partial_gradient_bytes_sent;
  }
  int64_t total_received() const {
    return all_gather_bytes_received + reduce_scatter_bytes_received + all_reduce_bytes_received +
           partial_gradient_bytes_received;
  }
};

// What the caller's optimizer keeps per parameter, for the per-rank totals:
// `copies` more tensors the size of each gradient shard (2 for Adam's m and
// v), printed as `description`. The fsdp layer knows no optimizer; the
// default prints no such line.
struct OptimizerStateSize {
  std::string description;
  int copies = 0;
};

// ---- the plan -----------------------------------------------------------------------------------

// A mesh by its sizes: `replicate` x `shard` ranks, as fully_shard reads a
// 2-D (replicate, shard) mesh (HSDP); replicate 1 is a 1-D shard mesh (FSDP).
// With tensor parallelism every such mesh is one tp rank's: `tensor_parallel`
// ranks (the innermost dim) hold the pieces of one model between them, and
// FSDP shards each piece over the ranks holding the same piece.
struct PlanMesh {
  int64_t replicate = 1;
  int64_t shard = 1;
  int64_t tensor_parallel = 1;

  int64_t world() const { return replicate * shard * tensor_parallel; }
  // "(shard=8)", "(replicate=2, shard=4)" or "(shard=2, tp=2)", as
  // DeviceMesh::to_string writes its dims.
  std::string to_string() const;
  bool operator==(const PlanMesh&) const = default;
};

// The most ranks a plan takes (train's --nproc bound).
inline constexpr int64_t kMaxPlanRanks = int64_t{1} << 20;

// `world` ranks as `replicate` x (world / (replicate x tensor_parallel)) x
// `tensor_parallel`. Throws tessera::Error unless 1 <= world <= kMaxPlanRanks
// and replicate x tensor_parallel (each >= 1) divides world.
PlanMesh plan_mesh(int64_t world, int64_t replicate = 1, int64_t tensor_parallel = 1);
// Throws tessera::Error unless both sizes are >= 1 and the world at most kMaxPlanRanks.
void check_mesh(const PlanMesh& mesh);

// One parameter of a group, over the plan's shard group of S ranks.
struct PlannedParam {
  std::string fqn;  // under the root
  Shape global_shape;  // what FSDP shards: the whole tensor, or under tensor parallelism tp rank 0's piece
  // Under tensor parallelism: the 1-rank tensor's shape, and the piece's
  // placement ("Shard(0)", "Shard(0) x 3 sections", "Replicate", "Replicate,
  // partial gradients"); without it, global_shape and "".
  Shape logical_shape;
  std::string tensor_parallel;
  bool partial_gradient = false;  // its reduced shards are summed over tp
  DType dtype = DType::f32;  // its own: the shards', the gradients' and the optimizer state's
  bool requires_grad = true;
  int64_t padded_rows = 0;   // every rank's shard: padded_shard_rows(rows, S)
  int64_t padding_rows = 0;  // padded_rows x S - rows: zero rows at the end of the last ranks' shards
  // What the all-gather moves for it and what it unshards into, when not
  // the shard in param_dtype (nn/all_gather_extension.h: NF4's packed rows).
  std::shared_ptr<nn::AllGatherExtension> all_gather_extension = nullptr;

  int64_t rows() const { return global_shape.at(0); }
  int64_t row_numel() const;  // elements per dim-0 row
  int64_t numel() const { return rows() * row_numel(); }
  int64_t shard_bytes() const;  // padded_rows rows of its own dtype: what to_empty allocates on every rank
  // Rank 0's real rows (padded_rows unless the tensor is empty): its gradient
  // and optimizer state rows, the most of any rank.
  int64_t rank0_rows() const { return std::min(padded_rows, rows()); }
};

// One fully_shard call's group, with its buffers' sizes over the plan's mesh.
struct PlannedUnit {
  std::string fqn;          // of its module under the root; "" for the root
  std::string module_type;  // "Block"
  int parent = -1;          // index in ShardingPlan::units of the FSDP module around it; -1 for the root
  std::vector<PlannedParam> params;  // empty: no parameters of its own, no group
  ReshardAfterForward reshard_after_forward = ReshardAfterForward::always();  // resolved against S
  DType param_dtype = DType::f32;   // of the all-gather and the unsharded parameters
  DType reduce_dtype = DType::f32;  // of the reduce-scatter
  bool offloaded = false;  // CPUOffloadPolicy: its shards, gradients and optimizer state in host memory
  // The flat layout (param_group.h): one rank's slot is every parameter's
  // padded chunk, one after the other.
  int64_t slot_numel = 0;               // over the shard group
  int64_t post_forward_slot_numel = 0;  // over reshard_after_forward's N ranks; 0 without an N
  int64_t all_gather_slot_bytes = 0;    // one rank's slot: slot_numel in param_dtype, or the extensions' payloads
  int64_t all_gather_buffer_bytes = 0;  // one all-gather's output: S slots
  int64_t post_forward_buffer_bytes = 0;  // the backward all-gather's output over N ranks
  // The unsharded parameters (no padding): in param_dtype, or as their
  // all-gather extensions unshard them.
  int64_t unsharded_bytes = 0;
  // The reduce-scatter's slot: the trainable parameters' padded chunks (a
  // frozen one has none), then one presence flag each.
  int64_t gradient_slot_numel = 0;
  int64_t gradient_flags = 0;
  int64_t partial_gradient_numel = 0;   // of the gradient slot: the partial-gradient parameters' padded chunks

  // "(root)" or the module's name.
  std::string label() const { return fqn.empty() ? std::string("(root)") : fqn; }
  bool has_group() const { return !params.empty(); }
  bool has_trainable_parameters() const;
};

// One FSDP module's unsharded parameter memory at a moment.
struct UnshardedHolding {
  std::string unit;                // PlannedUnit::label
  int64_t all_gather_buffer = 0;   // an issued all-gather's output (all ranks' slots)
  int64_t parameters = 0;          // the unsharded parameters
  int64_t post_forward_shard = 0;  // reshard_after_forward = N: this rank's slot of the N-way sharding

  int64_t total() const { return all_gather_buffer + parameters + post_forward_shard; }
};

// The most unsharded parameter memory one rank holds during a training step,
// when, and what is live then. The step is replayed group by group as
// FSDPParamGroup allocates and frees (param_group.cpp): forward in module
// order, each group prefetching the next one's all-gather; backward in
// reverse, each prefetching the one before it; a group's copy-out holds its
// all-gather buffer and its unsharded parameters at once. Modules are assumed
// to run forward in the order they are registered (true of GPT and Llama).
struct UnshardedPeak {
  int64_t bytes = 0;
  std::string moment;                      // "the copy-out of blocks.3 in forward"
  std::vector<UnshardedHolding> holdings;  // the FSDP modules holding memory then, in forward order
};

struct ShardingPlan {
  std::string model_type;
  PlanMesh mesh;
  std::vector<PlannedUnit> units;  // forward order (pre-order), the root first

  // Per rank. Every rank allocates the same padded shards; rank 0 holds the
  // most real rows, so its gradients and optimizer state are the largest.
  int64_t parameters = 0;        // elements of the planned parameters (a tied one once)
  int64_t tensors = 0;
  int64_t shard_bytes = 0;       // parameter shards
  int64_t gradient_bytes = 0;    // rank 0's gradient shards (trainable parameters)
  int64_t padding_bytes = 0;     // zero rows in the shards of one shard group (all ranks, without HSDP)
  // The part of shard_bytes and gradient_bytes (and so of the optimizer's
  // state) that CPU offload keeps in host memory.
  int64_t offloaded_shard_bytes = 0;
  int64_t offloaded_gradient_bytes = 0;
  int64_t all_groups_unsharded_bytes = 0;  // every group's unsharded parameters at once
  // Gradient accumulation (set_requires_gradient_sync(false) before all but
  // the last micro-batch): every group's unsharded gradients, kept between
  // micro-batches in param_dtype; none in reduce_dtype (the synced
  // micro-batch casts group by group, as it reduce-scatters).
  int64_t accumulated_gradient_bytes = 0;
  UnshardedPeak peak;

  // What one rank keeps on its device between steps and at the unsharded
  // peak (activations, reduce-scatter buffers and workspace not included):
  // the shards, gradients and optimizer state that are not offloaded, and
  // the unsharded peak, which is always on the device.
  int64_t device_bytes(const OptimizerStateSize& optimizer_state = {}) const;
  // The rest: offloaded shards, gradients and optimizer state.
  int64_t host_bytes(const OptimizerStateSize& optimizer_state = {}) const;
};

// What fully_shard(module, options) would do, as plan_fully_shard takes it:
// the options' mesh must be unset (the plan's PlanMesh stands for it).
struct PlannedCall {
  nn::Module* module = nullptr;
  FullyShardOptions options = {};
};

// The plan of applying `calls` in order (bottom-up, the root last: its
// module contains every other) on a mesh of `mesh`'s sizes. Reads only
// shapes, dtypes and module names: the model may live on meta, and nothing is
// sharded or allocated. Throws tessera::Error where fully_shard (or the
// root's lazy init) would: a call on a module inside an earlier one, a
// module called twice or outside the root, a 0-d or non-floating parameter,
// mixed dtypes without a param_dtype, tied parameters split across groups,
// a reshard_after_forward N that does not divide the shard group size.
ShardingPlan plan_fully_shard(const std::vector<PlannedCall>& calls, const PlanMesh& mesh);

// The plan of a live FSDP model. `root` must be the module fully_shard was
// applied to last, every group on one mesh; its parameters must be
// materialised (to_empty), since this runs the root's lazy init when no
// forward has yet. No communication.
ShardingPlan plan_of(nn::Module& root);

// When a step of several micro-batches reduces their gradients. FSDP2's
// accumulation recipe syncs once, after the last micro-batch
// (set_requires_gradient_sync(false) before the others): one reduce-scatter
// a group, but every group's unsharded gradients are kept in between
// (ShardingPlan::accumulated_gradient_bytes). Syncing every micro-batch
// reduce-scatters each one into the sharded gradients and keeps none.
enum class GradientSync { last_micro_batch, every_micro_batch };

// The collectives of one step of `micro_batches` forward + backward passes
// whose gradients are synced as `sync` says; 1 micro-batch = a plain step.
StepCommVolume comm_per_step(const ShardingPlan& plan, int64_t micro_batches = 1,
                             GradientSync sync = GradientSync::last_micro_batch);

// The plan as text: per FSDP module a table of its parameters, then the
// per-rank memory (with `optimizer_state`'s line when it has copies), the
// unsharded peak and what makes it, and the bytes of one plain step.
std::string format_plan(const ShardingPlan& plan, const OptimizerStateSize& optimizer_state = {});

// comm_per_step(plan_of(root), micro_batches, sync).
StepCommVolume expected_comm_per_step(nn::Module& root, int64_t micro_batches = 1,
                                      GradientSync sync = GradientSync::last_micro_batch);

// format_plan(plan_of(root), optimizer_state).
std::string sharding_plan(nn::Module& root, const OptimizerStateSize& optimizer_state = {});

}  // namespace tessera::fsdp
