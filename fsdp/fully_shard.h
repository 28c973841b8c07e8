// fsdp::fully_shard: FSDP2's entry point. Applied bottom-up (blocks first,
// then the root), each call takes the parameters of `module` that no call
// below it manages (and that are not ignored), shards each along dim 0 over
// the mesh's shard dim, and turns the module into an FSDP module: one
// parameter group, and hooks that all-gather it before forward and
// reduce-scatter its gradients after backward. The returned FSDPModule (or
// fsdp_module(module) later) is the handle FSDP2 users know.
//
//   auto mesh = dist::init_device_mesh(kCPU, {world->size()}, {"shard"});
//   GPT model(config, kMeta);
//   for (auto& block : model.blocks()) fsdp::fully_shard(*block, {.mesh = mesh});
//   fsdp::fully_shard(model, {.mesh = mesh});
//   model.to_empty(kCPU);
//   model.reset_parameters(seed);          // every rank fills only its rows
//   Optimizer optimizer(model.named_parameters());  // any optim:: optimizer: it steps the shards
//
// This header is the fsdp layer's public surface for a sharded module; what
// sits behind the handle (FSDPState, FSDPParamGroup, FSDPParam) is internal.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dist/comm_stats.h"
#include "dist/device_mesh.h"
#include "fsdp/mixed_precision.h"
#include "fsdp/offload_policy.h"
#include "fsdp/reshard_after_forward.h"
#include "nn/module.h"
#include "tensor/storage.h"

namespace tessera::fsdp {

class FSDPState;  // internal: fsdp/state.h

struct FullyShardOptions {
  // 1-D (shard) or 2-D (replicate, shard) for HSDP. Unset: a 1-D mesh over
  // dist::world() (one per world, shared by every call).
  std::optional<dist::DeviceMesh> mesh = std::nullopt;
  // Unset: always(), except for the root (never()): its parameters are
  // needed again at once when backward starts. to_group_of(N) is checked
  // here: N must divide the mesh's shard dim.
  std::optional<ReshardAfterForward> reshard_after_forward = std::nullopt;
  MixedPrecisionPolicy mp_policy = {};
  // Set: the shards, their gradients and the optimizer's state stay in host
  // memory and the mesh's cuda device computes (fsdp/offload_policy.h);
  // to_empty puts these shards in host memory whatever device it is given.
  std::optional<CPUOffloadPolicy> offload_policy = std::nullopt;
  // Left whole and unmanaged (not sharded, not reduced): the caller handles them.
  std::vector<std::shared_ptr<nn::Parameter>> ignored_params = {};
};

// The all-gather an async unshard() issued. wait() completes it (the
// parameters are then whole); it does nothing when that all-gather is already
// done: waited for, used by a forward, or dropped by reshard(). The next
// forward waits on its own too. A default-made handle waits for nothing.
class UnshardHandle {
 public:
  UnshardHandle() = default;
  void wait();

 private:
  friend class FSDPModule;
  UnshardHandle(std::weak_ptr<FSDPState> state, int64_t all_gather) : state_(std::move(state)), all_gather_(all_gather) {}

  std::weak_ptr<FSDPState> state_;
  int64_t all_gather_ = 0;  // the group's count of all-gathers when this one was issued; 0: none
};

// A handle on a fully_shard'ed module; cheap to copy. Every call throws
// tessera::Error once the module is gone.
class FSDPModule {
 public:
  nn::Module& module() const;

  // All-gathers the group now (async: returns at once with a handle).
  // Needs the root's first forward to have run (it sets up every group).
  UnshardHandle unshard(bool async_op = false);
  // Frees the unsharded parameters; the module holds its shards again.
  void reshard();

  // Each setter applies to every FSDP module in this one's module tree
  // (recurse) or to this module alone.
  // False: backward keeps unsharded gradients and reduce-scatters nothing
  // (gradient accumulation); the next synced backward reduces their sum.
  void set_requires_gradient_sync(bool requires_gradient_sync, bool recurse = true);
  // False: an unsynced backward leaves the group unsharded, saving the next
  // forward's all-gather. A synced backward always reshards: the optimizer
  // steps the shards.
  void set_reshard_after_backward(bool reshard_after_backward, bool recurse = true);
  // False: the backward's final callback leaves the last reduce-scatter in
  // flight (call it on the root for every micro-batch but the last).
  void set_is_last_backward(bool is_last_backward);
  // Explicit prefetch lists; they replace the default order (the next module
  // in forward, the previous one in backward). An empty list prefetches nothing.
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);

  // The collectives FSDP issued for this module's tree (recurse) or this
  // module alone, per kind (all-gathers, reduce-scatters, HSDP's
  // all-reduces), since fully_shard or the last reset: the calls and the
  // bytes this rank sent and received, as ProcessGroup::stats() counts them
  // (dist::collective_volume). Only FSDP's: other traffic on the same groups
  // (clip_grad_norm_, a loss all-reduce) is not here. `seconds` stays 0; the
  // process groups time their collectives.
  dist::CommStats communication_stats(bool recurse = true) const;
  // The part of it sent over tensor-parallel groups (the partial gradients'
  // sums after the reduce-scatter), which those groups' stats() count too.
  dist::CommStats tensor_parallel_communication_stats(bool recurse = true) const;
  void reset_communication_stats(bool recurse = true);
  // This rank's unsharded parameter memory (all-gather buffers, unsharded
  // parameters, post-forward shards) of this module's tree (recurse) or this
  // module alone: live and peak bytes, allocations (counted since the root's
  // first forward, which sets the counters up; zero before it).
  MemoryStats unsharded_memory(bool recurse = true) const;
  // Peak := live, for what unsharded_memory(recurse) covers.
  void reset_unsharded_memory_peak(bool recurse = true);

 private:
  friend FSDPModule fully_shard(nn::Module& module, FullyShardOptions options);
  friend std::optional<FSDPModule> fsdp_module(nn::Module& module);
  explicit FSDPModule(std::weak_ptr<FSDPState> state) : state_(std::move(state)) {}
  // The states behind `modules`; throws, naming `caller`, if one is gone.
  static std::vector<FSDPState*> live_states(const std::vector<FSDPModule>& modules, const char* caller);

  std::weak_ptr<FSDPState> state_;
};

FSDPModule fully_shard(nn::Module& module, FullyShardOptions options = {});
// The FSDP handle of a module fully_shard was applied to, or nullopt.
std::optional<FSDPModule> fsdp_module(nn::Module& module);

}  // namespace tessera::fsdp
