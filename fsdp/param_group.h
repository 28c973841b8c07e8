// fsdp::FSDPParamGroup: the parameters one fully_shard call manages, moved
// together: one all-gather to unshard them, one reduce-scatter for their
// gradients.
//
// The flat layout. For a collective over W ranks each parameter p contributes
// a chunk of ceil(rows_p / W) rows to every rank's slot (zero rows pad the
// tail), and a rank's slot is its parameters' chunks one after the other:
//
//   all-gather buffer  [ rank 0: p0 chunk | p1 chunk ] [ rank 1: p0 | p1 ] ...
//
// Unshard copies this rank's shards into its slot (copy-in, cast to
// param_dtype), all-gathers the slots in place, and copies each parameter's
// rows out of every slot into its unsharded tensor (copy-out). The gradient
// goes the other way: copy each rank's rows of every unsharded gradient into
// that rank's slot (cast to reduce_dtype), reduce-scatter, and each rank
// receives the sum of its own slot. The gradient slots end with one presence
// flag per parameter (1 where this rank has a gradient), so a parameter gets
// a sharded gradient exactly when some rank produced one, and the collective
// is the same size on every rank whatever the data did.
//
// States: sharded -> (unshard) -> unsharded -> (reshard) -> sharded, or, with
// reshard_after_forward = N, sharded_post_forward: each rank keeps its rows of
// a group-of-N sharding, so the backward all-gather spans N ranks only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dist/device_mesh.h"
#include "dist/trace.h"
#include "dist/work.h"
#include "fsdp/fsdp_param.h"
#include "fsdp/mixed_precision.h"
#include "tensor/storage.h"

namespace tessera::fsdp {

enum class ShardState { sharded, sharded_post_forward, unsharded };

// Where each parameter's chunk sits in a rank's slot, for W ranks.
struct FlatLayout {
  int world = 1;
  std::vector<int64_t> chunk_rows;  // ceil(rows_p / world)
  std::vector<int64_t> offsets;     // element offset of p's chunk in a slot
  int64_t slot_numel = 0;           // elements of one rank's slot (flags excluded)
};

// What the group needs from its mesh: the shard group (S ranks), the
// replicate group of HSDP (null on a 1-D mesh), and the group of N ranks that
// reshard_after_forward = N all-gathers over in backward (null otherwise).
struct GroupComm {
  dist::ProcessGroupPtr shard = nullptr;
  dist::ProcessGroupPtr replicate = nullptr;
  dist::ProcessGroupPtr post_forward = nullptr;
};

class FSDPParamGroup {
 public:
  // post_forward_shards: the N of reshard_after_forward (S: reshard fully,
  // 1: keep unsharded). The policy's dtypes are resolved here.
  FSDPParamGroup(std::vector<std::unique_ptr<FSDPParam>> params, GroupComm comm, const MixedPrecisionPolicy& policy,
                 int64_t post_forward_shards, std::string module_fqn);

  // ---- set-up (the root's lazy init) -------------------------------------------------
  // Creates the unsharded leaves, hooks their gradient accumulation, and
  // charges unsharded memory to `unsharded_memory`.
  // `outstanding` is shared by the root's groups: the reduce-scatters issued
  // and not yet finished (at most one stays in flight while backward goes on).
  // `on_gradient` runs first in every gradient-accumulation hook (the state
  // makes sure the root's final callback is queued).
  void lazy_init(std::shared_ptr<MemoryCounters> unsharded_memory,
                 std::shared_ptr<std::vector<FSDPParamGroup*>> outstanding, std::function<void()> on_gradient);
  void set_post_forward_shards(int64_t shards) { post_forward_shards_ = shards; }
  void set_module_fqn(std::string fqn) { module_fqn_ = std::move(fqn); }
  const std::string& module_fqn() const { return module_fqn_; }

  // ---- the collectives -------------------------------------------------------------------
  // Issues the all-gather (copy-in, then the collective on the comm thread).
  // No-op when unsharded or already issued.
  void unshard(bool async_op);
  // Waits for the issued all-gather and copies out; the Parameters then hold
  // the unsharded tensors. Issues first if nothing was issued.
  void wait_for_unshard();
  // Frees the unsharded memory; the Parameters hold their shards. With
  // to_post_forward, keeps this rank's group-of-N rows first.
  void reshard(bool to_post_forward = false);

  // ---- the hooks' steps ------------------------------------------------------------------
  void pre_forward();
  // Reshards as reshard_after_forward says (fully when no backward follows).
  void post_forward(bool backward_follows);
  void pre_backward();
  // Called by the gradient-accumulation hooks; runs post_backward when every
  // parameter of the group has its gradient.
  void on_gradient_accumulated();
  // Reshards (if reshard_after_backward) and, when gradients are synced,
  // reduce-scatters the unsharded gradients.
  void post_backward();
  // Waits for the reduce-scatter (+ HSDP all-reduce) and accumulates into the
  // sharded gradients. No-op when none is pending.
  void finish_reduce_scatter();
  // The end of a backward pass (the root's final callback): post_backward if
  // the group took part and it has not run, and reshard if asked.
  void finish_backward(bool wait_for_reduce_scatter);
  bool reduce_scatter_pending() const { return pending_reduce_scatter_.has_value(); }

  // ---- settings ----------------------------------------------------------------------------
  bool requires_gradient_sync = true;
  bool reshard_after_backward = true;

  // ---- inspection ----------------------------------------------------------------------------
  const std::vector<std::unique_ptr<FSDPParam>>& params() const { return params_; }
  ShardState state() const { return state_; }
  const GroupComm& comm() const { return comm_; }
  int64_t post_forward_shards() const { return post_forward_shards_; }
  DType param_dtype() const { return param_dtype_; }
  DType reduce_dtype() const { return reduce_dtype_; }
  const MixedPrecisionPolicy& policy() const { return policy_; }
  const FlatLayout& layout() const { return shard_layout_; }
  // Bytes of one all-gather output (all ranks' slots) in param_dtype.
  int64_t unsharded_bytes() const;

 private:
  const FlatLayout& layout_for(int world) const;
  void copy_out(const Tensor& gathered, const FlatLayout& layout);
  void issue_reduce_scatter();
  dist::Tracer* tracer() const;
  int trace_rank() const;

  std::vector<std::unique_ptr<FSDPParam>> params_;
  GroupComm comm_;
  MixedPrecisionPolicy policy_;
  DType param_dtype_;
  DType reduce_dtype_;
  int64_t post_forward_shards_;
  std::string module_fqn_;
  FlatLayout shard_layout_;
  FlatLayout post_forward_layout_;
  std::shared_ptr<MemoryCounters> unsharded_memory_;
  std::shared_ptr<std::vector<FSDPParamGroup*>> outstanding_;

  ShardState state_ = ShardState::sharded;
  struct PendingAllGather {
    Tensor gathered;  // all ranks' slots
    dist::Work work;
    int world;
  };
  std::optional<PendingAllGather> pending_all_gather_;
  Tensor post_forward_slot_;  // this rank's group-of-N slot while sharded_post_forward
  struct PendingReduceScatter {
    Tensor input;   // all ranks' gradient slots
    Tensor output;  // this rank's reduced slot (+ flags)
    dist::Work work;
  };
  std::optional<PendingReduceScatter> pending_reduce_scatter_;

  // Per backward pass.
  int64_t expected_gradients_ = 0;
  int64_t gradients_ready_ = 0;
  bool needs_post_backward_ = false;  // forwarded with grad, post_backward not yet run
  int64_t backward_start_us_ = 0;
  std::function<void()> on_gradient_;
};

}  // namespace tessera::fsdp
