// fsdp::fully_shard: FSDP2's entry point. Applied bottom-up (blocks first,
// then the root), each call takes the parameters of `module` that no call
// below it manages (and that are not ignored), shards each along dim 0 over
// the mesh's shard dim, and turns the module into an FSDP module: a
// FSDPState with one FSDPParamGroup and the hooks that all-gather before
// forward and reduce-scatter after backward. The returned FSDPModule (or
// fsdp_module(module) later) is the handle FSDP2 users know.
//
//   auto mesh = dist::init_device_mesh(kCPU, {world->size()}, {"shard"});
//   GPT model(config, kMeta);
//   for (auto& block : model.blocks()) fsdp::fully_shard(*block, {.mesh = mesh});
//   fsdp::fully_shard(model, {.mesh = mesh});
//   model.to_empty(kCPU);
//   model.reset_parameters(seed);          // every rank fills only its rows
//   Optimizer optimizer(model.named_parameters());  // any optim:: optimizer: it steps the shards
#pragma once

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "dist/device_mesh.h"
#include "fsdp/mixed_precision.h"
#include "fsdp/state.h"
#include "nn/module.h"

namespace tessera::fsdp {

// true: reshard after forward (all-gather again in backward); false: keep
// unsharded until after backward; N: keep this rank's rows of an N-way
// sharding, so the backward all-gather spans a group of N ranks (N divides the
// shard size; N = 1 is false, N = shard size is true).
using ReshardAfterForward = std::variant<bool, int64_t>;

struct FullyShardOptions {
  // 1-D (shard) or 2-D (replicate, shard) for HSDP. Unset: a 1-D mesh over
  // dist::world() (one per world, shared by every call).
  std::optional<dist::DeviceMesh> mesh = std::nullopt;
  // Unset: true, except for the root (false): its parameters are needed again
  // at once when backward starts.
  std::optional<ReshardAfterForward> reshard_after_forward = std::nullopt;
  MixedPrecisionPolicy mp_policy = {};
  // Left whole and unmanaged (not sharded, not reduced): the caller handles them.
  std::vector<std::shared_ptr<nn::Parameter>> ignored_params = {};
};

// Waits for an async unshard(); the next forward waits on its own too.
class UnshardHandle {
 public:
  UnshardHandle() = default;
  explicit UnshardHandle(FSDPParamGroup* group) : group_(group) {}
  void wait();

 private:
  FSDPParamGroup* group_ = nullptr;
};

// A handle on a fully_shard'ed module; cheap to copy, valid while the module lives.
class FSDPModule {
 public:
  explicit FSDPModule(FSDPState& state) : state_(&state) {}

  nn::Module& module() const { return state_->module(); }
  FSDPState& state() const { return *state_; }

  // All-gathers the group now (async: returns at once with a handle).
  UnshardHandle unshard(bool async_op = false);
  void reshard();
  // Every FSDP module in this one's tree (recurse) or this one alone.
  void set_requires_gradient_sync(bool requires_gradient_sync, bool recurse = true);
  // False: a backward without gradient sync (an accumulation micro-batch)
  // leaves the group unsharded, saving the next forward's all-gather. A
  // synced backward always reshards: the optimizer steps the shards.
  void set_reshard_after_backward(bool reshard_after_backward, bool recurse = true);
  // False: the backward's final callback leaves the last reduce-scatter in
  // flight (call it on the root for every micro-batch but the last).
  void set_is_last_backward(bool is_last_backward);
  // The process groups FSDP communicates on in this module's tree (recurse)
  // or this module alone: shard, replicate (HSDP) and post-forward groups,
  // each once. Their stats() are FSDP's traffic.
  std::vector<dist::ProcessGroupPtr> communication_groups(bool recurse = true) const;
  // Explicit prefetch lists; they replace the default order.
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);

 private:
  std::vector<FSDPState*> states_in_tree(bool recurse) const;
  FSDPState* state_;
};

FSDPModule fully_shard(nn::Module& module, FullyShardOptions options = {});
// The FSDP handle of a module fully_shard was applied to, or nullopt.
std::optional<FSDPModule> fsdp_module(nn::Module& module);

}  // namespace tessera::fsdp
