#include "fsdp/offloaded_optimizer_step.h"

#include <future>
#include <memory>
#include <unordered_set>
#include <utility>

#include "fsdp/param_group.h"
#include "fsdp/state.h"
#include "tensor/error.h"
#include "tensor/parallel.h"
#include "tensor/storage.h"

namespace tessera::fsdp {

OffloadedOptimizerStep::OffloadedOptimizerStep(nn::Module& root, optim::Optimizer& optimizer)
    : root_(&root), optimizer_(&optimizer) {
  root_state();  // checks it
  std::unordered_set<const nn::Parameter*> managed;
  for (const FSDPParamGroup* group : groups_in_forward_order()) {
    for (const auto& param : group->params()) managed.insert(&param->param());
  }
  // A parameter no group manages would have no copy-in to wait for its step,
  // and the next backward could write its gradient while the step reads it.
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    for (const auto& [name, param] : group.params) {
      TESSERA_CHECK(managed.contains(param.get()),
                    "OffloadedOptimizerStep: the optimizer's parameter '{}' is in no FSDP group of this {}; every "
                    "parameter it steps must be sharded (and offloaded) by fully_shard",
                    name, root.type_name());
    }
  }
}

FSDPState& OffloadedOptimizerStep::root_state() const {
  FSDPState* state = root_->extension<FSDPState>();
  TESSERA_CHECK(state != nullptr,
                "OffloadedOptimizerStep: this {} is not an FSDP module; apply fully_shard to it (after its blocks) "
                "with a CPUOffloadPolicy first",
                root_->type_name());
  TESSERA_CHECK(!state->initialized() || state->is_root(),
                "OffloadedOptimizerStep: this {} is inside another FSDP module; give the root", root_->type_name());
  state->lazy_init();  // as the root's first forward would
  return *state;
}

// The first forward records the order; before it, the module tree's.
std::vector<FSDPParamGroup*> OffloadedOptimizerStep::groups_in_forward_order() const {
  std::vector<FSDPParamGroup*> groups;
  for (FSDPState* member : root_state().forward_order()) {
    FSDPParamGroup* group = member->group();
    if (group == nullptr) continue;
    TESSERA_CHECK(group->offloaded(),
                  "OffloadedOptimizerStep: FSDP module '{}' ({}) is not offloaded; every group needs a "
                  "CPUOffloadPolicy (fully_shard's offload_policy), since its shards are stepped on the host",
                  member->fqn(), member->module().type_name());
    groups.push_back(group);
  }
  return groups;
}

OffloadedOptimizerStep::~OffloadedOptimizerStep() {
  if (worker_.joinable()) worker_.join();
}

void OffloadedOptimizerStep::start() {
  TESSERA_CHECK(!worker_.joinable(),
                "OffloadedOptimizerStep::start: the previous step is still running; wait() for it first");
  error_ = nullptr;
  groups_ = groups_in_forward_order();
  // Each group's copy-in waits for its own part of the step.
  std::vector<std::vector<const nn::Parameter*>> parts;
  auto released = std::make_shared<std::vector<std::promise<void>>>(groups_.size());
  for (size_t index = 0; index < groups_.size(); ++index) {
    std::vector<const nn::Parameter*>& part = parts.emplace_back();
    for (const auto& param : groups_[index]->params()) part.push_back(&param->param());
    groups_[index]->set_host_step((*released)[index].get_future().share());
  }
  // The thread works as this one would: the same memory scope (a rank's)
  // and intra-op threads.
  std::shared_ptr<MemoryCounters> scope = MemoryScope::current();
  const int threads = num_threads();
  worker_ = std::thread([this, parts = std::move(parts), released, scope = std::move(scope), threads] {
    const MemoryScope charged(scope);
    set_num_threads(threads);
    size_t next = 0;  // the first group not yet released
    try {
      optimizer_->step_in_parts(parts, [&](size_t part) {
        for (const auto& param : groups_[part]->params()) param->param().tensor().set_grad(Tensor());
        (*released)[part].set_value();
        next = part + 1;
        if (after_group_) after_group_(part);
      });
    } catch (...) {
      error_ = std::current_exception();
      for (; next < released->size(); ++next) (*released)[next].set_exception(error_);
    }
  });
}

void OffloadedOptimizerStep::wait() {
  if (worker_.joinable()) worker_.join();
  if (error_ != nullptr) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace tessera::fsdp
