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
// one FSDPStateContext.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/param_group.h"
#include "nn/module.h"

namespace tessera::fsdp {

class FSDPState;

// Shared by the root and every FSDP module below it.
struct FSDPStateContext {
  std::vector<FSDPState*> states;  // pre-order, the root first
  // The order of the first iteration's pre-forwards and post-forwards (the
  // root's comes first in one and last in the other). Default prefetch: the
  // next in pre-forward order during forward; the previous in post-forward
  // order during backward (backward runs it in reverse).
  std::vector<FSDPState*> pre_forward_order;
  std::vector<FSDPState*> post_forward_order;
  bool forward_order_recorded = false;
  bool final_callback_queued = false;
  // This rank's unsharded parameter memory (all-gather buffers and unsharded
  // tensors); charged to the rank's memory scope too.
  std::shared_ptr<MemoryCounters> unsharded_memory;
  std::shared_ptr<std::vector<FSDPParamGroup*>> outstanding_reduce_scatters;
};

// The FSDPState whose group manages `param`, or null (any thread).
FSDPState* managing_state(const nn::Parameter& param);

class FSDPState : public nn::ModuleExtension {
 public:
  FSDPState(nn::Module& module, std::unique_ptr<FSDPParamGroup> group, dist::DeviceMesh mesh,
            MixedPrecisionPolicy policy, std::optional<int64_t> reshard_after_forward);
  ~FSDPState() override;

  nn::Module& module() const { return *module_; }
  FSDPParamGroup* group() const { return group_.get(); }
  const dist::DeviceMesh& mesh() const { return mesh_; }
  const MixedPrecisionPolicy& policy() const { return policy_; }
  // The fully qualified name under the root ("" for the root); known after lazy init.
  const std::string& fqn() const { return fqn_; }
  bool is_root() const { return is_root_; }
  bool initialized() const { return context_ != nullptr; }
  const std::shared_ptr<FSDPStateContext>& context() const { return context_; }

  // Settings (FSDPModule's setters land here).
  std::optional<std::vector<FSDPState*>> forward_prefetch;
  std::optional<std::vector<FSDPState*>> backward_prefetch;
  bool is_last_backward = true;

  // The root's lazy init, also callable directly (plans, state dicts): makes
  // this state the root of every FSDPState in its module tree.
  void lazy_init();

 private:
  std::optional<nn::TensorList> pre_forward(const nn::TensorList& inputs);
  std::optional<Tensor> post_forward(const Tensor& output);
  void pre_backward();
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
  std::optional<int64_t> reshard_after_forward_;  // unset: true for non-root, false for the root
  std::string fqn_;
  bool is_root_ = false;
  std::shared_ptr<FSDPStateContext> context_;
  std::vector<autograd::HookHandle> hooks_;
  int64_t forward_start_us_ = 0;
  int64_t backward_start_us_ = 0;
  int forward_depth_ = 0;
};

}  // namespace tessera::fsdp
