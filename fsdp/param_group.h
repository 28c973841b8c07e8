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
// is the same size on every rank whatever the data did. Only trainable
// parameters (requires_grad when the group is made) have a chunk and a flag
// in the gradient slots: a frozen one costs the reduce-scatter nothing, and
// gets no gradient buffer (a frozen base under LoRA adapters).
//
// States: sharded -> (unshard) -> unsharded -> (reshard) -> sharded, or, with
// reshard_after_forward = to_group_of(N), sharded_post_forward: each rank
// keeps its rows of a group-of-N sharding, so the backward all-gather spans N
// ranks only.
//
// With all-gather extensions (nn/all_gather_extension.h) the group's
// all-gather moves payloads instead: each parameter's pre_all_gather gives
// them (a parameter without one gives its padded shard in param_dtype), the
// payload sizes are checked across ranks, and a rank's slot is every payload
// one after the other, in their common dtype or, when dtypes differ, as
// bytes at 16-byte aligned offsets. Copy-out hands each parameter its
// payloads from every rank to post_all_gather. Such a group reshards fully
// (no to_group_of(N)) and keeps its shards on the device.
//
// Under CPU offload (fsdp/offload_policy.h) the shards and their gradients
// are in host memory: the copy-in is a host-to-device copy of each padded
// shard into its chunk, and the reduced slot comes back device-to-host into
// a page-locked landing buffer, accumulated into the gradients on the host.
//
// Internal to the fsdp layer (not installed: tools/install_headers.py); users
// reach a group through FSDPModule (fsdp/fully_shard.h).
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "dist/comm_stats.h"
#include "dist/device_mesh.h"
#include "dist/trace.h"
#include "dist/work.h"
#include "fsdp/fsdp_param.h"
#include "fsdp/mixed_precision.h"
#include "fsdp/offload_policy.h"
#include "fsdp/reshard_after_forward.h"
#include "fsdp/streams.h"
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

// One rank's all-gather slot for payloads (nn/all_gather_extension.h) of
// these dtypes and sizes, in order: elements of their dtype when all share
// one, else bytes (u8), each payload starting on a 16-byte boundary. The
// group lays out its all-gathers so, and the sharding plan counts them so.
struct PayloadSlotLayout {
  DType buffer_dtype = DType::u8;
  bool mixed = false;            // the payloads' dtypes differ: a byte slot with zeroed alignment gaps
  int64_t slot_units = 0;        // in units of buffer_dtype
  std::vector<int64_t> offsets;  // per payload, in units of buffer_dtype
  int64_t slot_bytes() const { return slot_units * static_cast<int64_t>(element_size(buffer_dtype)); }
};
PayloadSlotLayout payload_slot_layout(const std::vector<nn::PayloadSize>& payloads);

// What the group needs from its mesh: the shard group (S ranks), the
// replicate group of HSDP (null on a 1-D mesh), and the group of N ranks that
// reshard_after_forward = to_group_of(N) all-gathers over in backward (null
// otherwise). FSDP makes that last one itself, so it records its collectives
// to the shard group's tracer: tracing the mesh traces all of FSDP. Under
// tensor parallelism, also the tp group over which the reduced shards of
// parameters with partial gradients (sequence-parallel norms) are summed
// (null when there are none).
struct GroupComm {
  dist::ProcessGroupPtr shard = nullptr;
  dist::ProcessGroupPtr replicate = nullptr;
  dist::ProcessGroupPtr post_forward = nullptr;
  dist::ProcessGroupPtr tensor_parallel = nullptr;
};

class FSDPParamGroup {
 public:
  // The policy's dtypes and reshard_after_forward are resolved here (see
  // set_reshard_after_forward). `offload_to`: under CPU offload, the device
  // that computes (the mesh's); the shards must then be in host memory.
  FSDPParamGroup(std::vector<std::unique_ptr<FSDPParam>> params, GroupComm comm, const MixedPrecisionPolicy& policy,
                 ReshardAfterForward reshard_after_forward, std::string module_fqn,
                 std::optional<Device> offload_to = std::nullopt);
  // Unwinding mid-step (an error), compute's buffers that a side stream
  // still reads or writes are released only behind compute's wait for the
  // side streams' work.
  ~FSDPParamGroup();
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  // ---- set-up (the root's lazy init) -------------------------------------------------
  // Creates the unsharded leaves, hooks their gradient accumulation, and
  // charges unsharded memory to `unsharded_memory`.
  // `outstanding` is shared by the root's groups: the reduce-scatters issued
  // and not yet finished (at most one stays in flight while backward goes on).
  // `on_gradient` runs first in every gradient-accumulation hook (the state
  // makes sure the root's final callback is queued).
  // `streams` are the root's (FSDP2's side streams on cuda; the caller's on cpu).
  void lazy_init(std::shared_ptr<MemoryCounters> unsharded_memory,
                 std::shared_ptr<std::vector<FSDPParamGroup*>> outstanding, std::shared_ptr<FSDPStreams> streams,
                 std::function<void()> on_gradient);
  // Resolved against the shard group (ReshardAfterForward::resolved), so
  // to_group_of(N) is left only for 1 < N < S; that N must be the size of
  // comm().post_forward.
  void set_reshard_after_forward(ReshardAfterForward reshard_after_forward);
  void set_module_fqn(std::string fqn) { module_fqn_ = std::move(fqn); }
  const std::string& module_fqn() const { return module_fqn_; }

  // ---- the collectives -------------------------------------------------------------------
  // Issues the all-gather (copy-in, then the collective on the comm thread).
  // No-op when unsharded or already issued.
  void unshard(bool async_op);
  // Waits for the issued all-gather and copies out; the Parameters then hold
  // the unsharded tensors. Issues first if nothing was issued.
  void wait_for_unshard();
  // The number of the all-gather in flight (counting from 1 over the group's
  // life), or nullopt: what an UnshardHandle waits for.
  std::optional<int64_t> pending_all_gather() const;
  // Frees the unsharded memory; the Parameters hold their shards. `target`
  // is sharded, or sharded_post_forward to keep this rank's group-of-N rows
  // first (without a post-forward group that is sharded too).
  void reshard(ShardState target = ShardState::sharded);

  // ---- the hooks' steps ------------------------------------------------------------------
  void pre_forward();
  // Reshards as reshard_after_forward says (fully when no backward follows).
  void post_forward(bool backward_follows);
  void pre_backward();
  // Called by the gradient-accumulation hooks; runs post_backward when every
  // trainable parameter of the group has its gradient, and, for a group with
  // frozen parameters, its module's backward is done (below).
  void on_gradient_accumulated();
  // A frozen parameter has no gradient to say that the backward is done with
  // it: its module's product with it (for the input's gradient) may run after
  // every trainable gradient of the group has arrived. So such a group waits
  // for the gradients of its module's inputs, as FSDP2 does: the module's
  // state announces each forward whose inputs will receive them, and their
  // arrival in backward (FSDPState::through_post_backward). A module whose
  // inputs need no gradient leaves the group to the end of the pass
  // (finish_backward).
  bool has_frozen_parameters() const { return trainable_.size() < params_.size(); }
  void expect_input_gradient();
  void on_input_gradient();
  // Reshards (if reshard_after_backward) and, when gradients are synced,
  // reduce-scatters the unsharded gradients.
  void post_backward();
  // Waits for the reduce-scatter (+ HSDP all-reduce) and accumulates into the
  // sharded gradients (offloaded: starts their copy to the host, which
  // finish_host_gradients accumulates). No-op when none is pending.
  void finish_reduce_scatter();
  // Offloaded: waits for the reduced gradients' copy to the host and adds
  // them into the host gradients. No-op when none is pending.
  void finish_host_gradients();
  // Offloaded: blocks the host until every copy that reads the host shards
  // has run, so it may write them (load a state dict). No-op otherwise.
  void wait_for_shard_reads();
  // Offloaded, with the optimizer step overlapped with the next forward
  // (offloaded_optimizer_step.h): a host thread steps this group's shards
  // until `stepped` is ready. The next copy-in, the host gradients'
  // accumulation and the state dicts wait for it (rethrowing the step's
  // error) before they touch the shards or gradients.
  void set_host_step(std::shared_future<void> stepped) { host_step_ = std::move(stepped); }
  void wait_for_host_step();
  // The end of a backward pass (the root's final callback): post_backward if
  // the group took part and it has not run, and reshard if asked.
  void finish_backward(bool wait_for_reduce_scatter);
  bool reduce_scatter_pending() const { return pending_reduce_scatter_.has_value(); }

  // ---- settings (FSDPModule's setters) -------------------------------------------------------
  // False: backward keeps unsharded gradients and issues no reduce-scatter.
  void set_requires_gradient_sync(bool sync) { requires_gradient_sync_ = sync; }
  bool requires_gradient_sync() const { return requires_gradient_sync_; }
  // False: an unsynced backward leaves the group unsharded.
  void set_reshard_after_backward(bool reshard) { reshard_after_backward_ = reshard; }
  bool reshard_after_backward() const { return reshard_after_backward_; }

  // ---- inspection ----------------------------------------------------------------------------
  const std::vector<std::unique_ptr<FSDPParam>>& params() const { return params_; }
  ShardState state() const { return state_; }
  const GroupComm& comm() const { return comm_; }
  // Resolved: to_group_of(N) only for 1 < N < S.
  const ReshardAfterForward& reshard_after_forward() const { return reshard_after_forward_; }
  DType param_dtype() const { return param_dtype_; }
  DType reduce_dtype() const { return reduce_dtype_; }
  const MixedPrecisionPolicy& policy() const { return policy_; }
  const FlatLayout& layout() const { return shard_layout_; }
  // The reduce-scatter's: the trainable parameters only (flags excluded).
  const FlatLayout& gradient_layout() const { return gradient_layout_; }
  // Indices into params() of the trainable parameters, in gradient_layout's order.
  const std::vector<size_t>& trainable() const { return trainable_; }
  // Bytes of one all-gather output (all ranks' slots) in param_dtype (without
  // all-gather extensions).
  int64_t unsharded_bytes() const;
  // Where the collectives and the unsharded parameters live: the shards'
  // device, or the computing device under CPU offload.
  Device device() const;
  bool offloaded() const { return offload_to_.has_value(); }
  // The collectives this group issued since construction or the last reset,
  // counted when issued with dist::collective_volume (the volumes
  // ProcessGroup::stats() counts); `seconds` stays 0: the groups time them.
  const dist::CommStats& comm_stats() const { return comm_stats_; }
  // The part of comm_stats() sent over the tensor-parallel group (the
  // partial gradients' sums), which that group's own stats count too.
  const dist::CommStats& tensor_parallel_comm_stats() const { return tensor_parallel_comm_stats_; }
  void reset_comm_stats() {
    comm_stats_ = dist::CommStats{};
    tensor_parallel_comm_stats_ = dist::CommStats{};
  }

 private:
  const FlatLayout& layout_for(int world) const;
  // Copies this rank's shards into its all-gather slot (cast to param_dtype),
  // from the device's shards or, offloaded, from host memory.
  void copy_in_shards(const Tensor& slot, const FlatLayout& layout);
  // Adds `reduced` (this rank's reduced slot, on the device or on the host)
  // into the sharded gradients, where `present` says a parameter got one.
  // With adopt_views (a host landing buffer), a first gradient in the
  // parameter's dtype is a view of `reduced` instead of a copy.
  void accumulate_gradients(const Tensor& reduced, const std::vector<bool>& present,
                            const std::shared_ptr<Stream>& compute, bool adopt_views = false);
  // Offloaded: a host landing buffer no parameter's gradient views (a new
  // one when every one is viewed).
  Tensor free_host_landing(int64_t numel);
  void copy_out(const Tensor& gathered, const FlatLayout& layout);
  // The all-gather extensions' path (see the top of this file).
  struct PayloadPiece {
    size_t param;      // index into params_
    int64_t offset;    // in a slot, in units of the buffer's dtype
    int64_t numel;     // elements of `dtype`
    DType dtype;
  };
  struct PayloadLayout {
    DType buffer_dtype = DType::u8;
    int64_t slot_units = 0;  // one rank's slot, in units of buffer_dtype
    std::vector<PayloadPiece> pieces;
    std::vector<std::shared_ptr<const void>> metadata;  // per parameter
  };
  void unshard_payloads(bool async_op);
  // Every rank's payload dtypes and sizes, exchanged and compared: an error
  // naming the parameter and the ranks when they differ.
  void check_payloads_agree(const PayloadLayout& layout) const;
  void copy_out_payloads(const Tensor& gathered, const PayloadLayout& layout);
  void issue_reduce_scatter();
  void count(dist::CollectiveKind kind, int64_t bytes, const dist::ProcessGroup& group);
  dist::Tracer* tracer() const;
  int trace_rank() const;

  std::vector<std::unique_ptr<FSDPParam>> params_;
  GroupComm comm_;
  // The trainable parameters (indices into params_) and their gradient slot.
  std::vector<size_t> trainable_;
  FlatLayout gradient_layout_;
  // Positions in trainable_ of the parameters whose gradients are partial over
  // tensor parallelism: their reduced shards are summed over comm_.tensor_parallel.
  std::vector<size_t> partial_gradient_params_;
  MixedPrecisionPolicy policy_;
  DType param_dtype_;
  DType reduce_dtype_;
  ReshardAfterForward reshard_after_forward_ = ReshardAfterForward::always();
  bool requires_gradient_sync_ = true;
  bool reshard_after_backward_ = true;
  std::string module_fqn_;
  FlatLayout shard_layout_;
  FlatLayout post_forward_layout_;
  std::shared_ptr<MemoryCounters> unsharded_memory_;
  std::shared_ptr<std::vector<FSDPParamGroup*>> outstanding_;
  std::shared_ptr<FSDPStreams> streams_;
  std::optional<Device> offload_to_;  // the computing device under CPU offload
  bool extended_ = false;             // some parameter has an all-gather extension

  ShardState state_ = ShardState::sharded;
  struct PendingAllGather {
    Tensor gathered;  // all ranks' slots
    dist::Work work;
    int world;
    int64_t number;  // counting all-gathers from 1
    Tensor read_from_compute;  // compute's buffer the copy-in read (post-forward slot)
    Event issued;              // on the all-gather stream after the issue, or its failure (cuda)
    std::optional<PayloadLayout> payloads;  // with all-gather extensions
  };
  int64_t all_gathers_issued_ = 0;
  std::optional<PendingAllGather> pending_all_gather_;
  // Issues `pending`'s all-gather of this rank's `slot` on `group` once the
  // copy-in is done, and counts it; waits for it unless async_op.
  void issue_all_gather(PendingAllGather pending, const Tensor& slot, dist::ProcessGroup& group, int64_t slot_bytes,
                        bool async_op);
  Tensor post_forward_slot_;  // this rank's group-of-N slot while sharded_post_forward
  struct PendingReduceScatter {
    Tensor input;   // all ranks' gradient slots
    Tensor output;  // this rank's reduced slot (+ flags)
    dist::Work work;
    std::vector<bool> present_here;  // per trainable parameter (trainable_'s order): this rank gave a gradient
    std::vector<Tensor> gradients_read;  // compute's unsharded gradients the copy-in read (cuda)
    Event copied_in;                     // on the reduce-scatter stream after the copy-in (cuda)
  };
  std::optional<PendingReduceScatter> pending_reduce_scatter_;
  // Offloaded: the reduced slots' way to the host. Page-locked buffers of
  // one reduced slot (+ flags) in reduce_dtype, reused every backward. When
  // reduce_dtype is the parameters' dtype a parameter's first gradient is a
  // view of the slot it landed in (no copy, no fresh host memory a step), so
  // a slot still holding gradients is not written again: the next backward
  // lands in another (a second one under gradient accumulation).
  std::vector<Tensor> host_landings_;
  struct PendingHostGradient {
    Event landed;                    // `landing` holds the reduced slot
    Tensor landing;                  // one of host_landings_
    std::vector<bool> present_here;  // as the reduce-scatter's
  };
  std::optional<PendingHostGradient> pending_host_gradient_;
  Event shards_read_;  // offloaded: after the latest host-to-device copy of the shards
  std::shared_future<void> host_step_;  // offloaded: the overlapped optimizer step of the shards, if pending

  // Per backward pass.
  int64_t expected_gradients_ = 0;
  int64_t gradients_ready_ = 0;
  bool needs_post_backward_ = false;  // forwarded with grad, post_backward not yet run
  int64_t input_gradients_pending_ = 0;  // with frozen parameters: announced inputs whose gradient is to come
  bool inputs_announced_ = false;         // with frozen parameters: some input will get a gradient
  int64_t backward_start_us_ = 0;
  std::function<void()> on_gradient_;
  dist::CommStats comm_stats_;
  dist::CommStats tensor_parallel_comm_stats_;
};

}  // namespace tessera::fsdp
