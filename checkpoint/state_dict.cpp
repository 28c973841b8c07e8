// Model and optimizer state as named entries that view the live tensors.
#include "checkpoint/state_dict.h"

namespace tessera::checkpoint {

StateEntry entry_like(const nn::Parameter& parameter, const Tensor& local) {
  if (!parameter.is_sharded()) return local;
  const nn::ShardingSpec& spec = *parameter.sharding();
  return dist::DTensor(local, spec.mesh, spec.placements, spec.global_shape);
}

DistributedStateDict model_state(const nn::Module& module, const std::string& prefix) {
  DistributedStateDict state;
  for (const auto& [name, parameter] : module.named_parameters()) {
    state[prefix + name] = entry_like(*parameter, parameter->tensor().detach());
  }
  return state;
}

DistributedStateDict optimizer_state(optim::Optimizer& optimizer) {
  optimizer.init_state();
  DistributedStateDict state;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    for (const auto& [name, parameter] : group.params) {
      for (const auto& [key, value] : optimizer.state(name)) {
        // 0-d entries (the step count) are the same on every rank: whole tensors.
        state[kOptimizerPrefix + name + "." + key] = value.dim() == 0 ? StateEntry(value) : entry_like(*parameter, value);
      }
    }
  }
  return state;
}

DistributedStateDict training_state_dict(const nn::Module& module, optim::Optimizer& optimizer) {
  DistributedStateDict state = model_state(module);
  state.merge(optimizer_state(optimizer));
  return state;
}

}  // namespace tessera::checkpoint
