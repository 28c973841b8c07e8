// fsdp::FSDPState: what fully_shard attaches to a module - its parameter
// group (if it manages any parameters) and the hooks that drive it:
//
//   pre-forward    (root: lazy init) cast inputs, wait for or issue this
//                  group's all-gather, prefetch the next group's;
//   post-forward   reshard per reshard_after_forward, cast the output, and
//                  hook the output so the group unshards again before its
//                  backward;
//   pre-backward   (the output's gradient hook) unshard, prefetch the group
//                  that runs backward next (the previous one in forward order);
//   post-backward  (every parameter's gradient accumulated) reshard and
//                  reduce-scatter;
//   root final callback (engine end) finish every group the pass touched:
//                  unused parameters, outstanding reduce-scatters, reshards.
//
// The root is the FSDP module whose forward runs first with no FSDP forward
// around it; at that first forward it gathers every FSDPState below it into
// one context that they share (state.cpp).
//
// Internal to the fsdp layer (not installed: tools/install_headers.py); users
// hold an FSDPModule (fsdp/fully_shard.h), whose setters land here.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/param_group.h"
#include "fsdp/reshard_after_forward.h"
#include "nn/module.h"
#include "tensor/storage.h"

namespace tessera::fsdp {

class FSDPState;
struct FSDPStateContext;  // shared by the root and every FSDP module below it (state.cpp)

// The FSDPState whose group manages `param`, or null (any thread).
FSDPState* managing_state(const nn::Parameter& param);

// Made by fully_shard with std::make_shared (handles hold weak pointers).
class FSDPState : public nn::ModuleExtension, public std::enable_shared_from_this<FSDPState> {
 public:
  // reshard_after_forward unset: always() below the root, never() for the
  // root (its parameters are needed again as soon as backward starts).
  FSDPState(nn::Module& module, std::unique_ptr<FSDPParamGroup> group, dist::DeviceMesh mesh,
            MixedPrecisionPolicy policy, std::optional<ReshardAfterForward> reshard_after_forward);
  ~FSDPState() override;

  nn::Module& module() const { return *module_; }
  FSDPParamGroup* group() const { return group_.get(); }
  const dist::DeviceMesh& mesh() const { return mesh_; }
  const MixedPrecisionPolicy& policy() const { return policy_; }
  // The fully qualified name under the root ("" for the root); known after lazy init.
  const std::string& fqn() const { return fqn_; }
  bool is_root() const { return is_root_; }
  bool initialized() const { return context_ != nullptr; }
  // Every state of the root's tree, pre-order, the root first (after lazy init).
  const std::vector<FSDPState*>& tree() const;
  // Every state of the root's tree, those the first forward ran in the order
  // of their pre-forwards, then the others in tree() order (after lazy init).
  std::vector<FSDPState*> forward_order() const;

  // ---- settings (FSDPModule's setters) ------------------------------------------------------
  // Explicit prefetch targets, replacing the default order (nullopt: default).
  void set_forward_prefetch(std::optional<std::vector<FSDPState*>> targets) { forward_prefetch_ = std::move(targets); }
  void set_backward_prefetch(std::optional<std::vector<FSDPState*>> targets) { backward_prefetch_ = std::move(targets); }
  // Read by the root's final callback: false leaves the last reduce-scatter in flight.
  void set_is_last_backward(bool is_last_backward) { is_last_backward_ = is_last_backward; }
  bool is_last_backward() const { return is_last_backward_; }

  // This rank's unsharded parameter memory (all-gather buffers, unsharded
  // tensors, post-forward slots) of this state's group alone, or (recurse)
  // of every group in its module's tree; zero before the root's lazy init.
  // Both are charged to the rank's memory scope too.
  MemoryStats unsharded_memory(bool recurse) const;
  void reset_unsharded_memory_peak(bool recurse);

  // The root's lazy init, also callable directly (plans, state dicts): makes
  // this state the root of every FSDPState in its module tree. `streams`:
  // the streams its groups share, on their device; null makes FSDPStreams.
  // A test hands its own with one protocol step replaced (fsdp/streams.h).
  void lazy_init(std::shared_ptr<FSDPStreams> streams = nullptr);

 private:
  std::optional<nn::TensorList> pre_forward(const nn::TensorList& inputs);
  std::optional<Tensor> post_forward(const Tensor& output);
  void pre_backward();
  // With frozen parameters: the inputs that will get a gradient, routed
  // through a node that tells the group when they have (param_group.h);
  // nullopt when none will.
  std::optional<nn::TensorList> through_post_backward(const nn::TensorList& inputs);
  // Once per backward pass: the root's final callback, queued by whichever
  // hook of the tree runs first.
  void queue_final_callback();
  void root_post_backward_final();
  void prefetch(const std::vector<FSDPState*>& targets);
  void record_once(std::vector<FSDPState*>& order);
  FSDPState* neighbour_in(const std::vector<FSDPState*>& order, int step) const;
  dist::Tracer* tracer() const;
  int trace_rank() const;

  nn::Module* module_;
  std::unique_ptr<FSDPParamGroup> group_;
  dist::DeviceMesh mesh_;
  MixedPrecisionPolicy policy_;
  std::optional<ReshardAfterForward> reshard_after_forward_;  // unset: always() below the root, never() for it
  std::string fqn_;
  bool is_root_ = false;
  std::shared_ptr<FSDPStateContext> context_;
  std::optional<std::vector<FSDPState*>> forward_prefetch_;
  std::optional<std::vector<FSDPState*>> backward_prefetch_;
  bool is_last_backward_ = true;
  // Charged by the group (own), and by it and every group below (subtree,
  // whose parent is the enclosing state's subtree, or the rank's scope).
  std::shared_ptr<MemoryCounters> own_memory_;
  std::shared_ptr<MemoryCounters> subtree_memory_;
  std::vector<autograd::HookHandle> hooks_;
  int64_t forward_start_us_ = 0;
  int64_t backward_start_us_ = 0;
  int forward_depth_ = 0;
};

}  // namespace tessera::fsdp
