// optim::Optimizer: parameter groups, the step loop and named state.
#include "nn/optim/optimizer.h"

#include <unordered_set>

#include "autograd/grad_mode.h"
#include "tensor/host_staging.h"
#include "tensor/ops.h"

namespace tessera::optim {

std::vector<ParamGroup> weight_decay_groups(const std::vector<nn::NamedParameter>& params, double weight_decay) {
  ParamGroup decay{.params = {}, .lr = std::nullopt, .weight_decay = weight_decay};
  ParamGroup no_decay{.params = {}, .lr = std::nullopt, .weight_decay = 0.0};
  for (const auto& named : params) (named.second->tensor().dim() >= 2 ? decay : no_decay).params.push_back(named);
  return {std::move(decay), std::move(no_decay)};
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, double default_lr, double default_weight_decay, std::string name)
    : name_(std::move(name)), groups_(std::move(groups)) {
  std::unordered_set<const nn::Parameter*> seen;
  for (ParamGroup& group : groups_) {
    if (!group.lr) group.lr = default_lr;
    if (!group.weight_decay) group.weight_decay = default_weight_decay;
    TESSERA_CHECK(*group.lr >= 0.0, "{}: lr must be >= 0, got {}", name_, *group.lr);
    TESSERA_CHECK(*group.weight_decay >= 0.0, "{}: weight_decay must be >= 0, got {}", name_, *group.weight_decay);
    for (const auto& [param_name, param] : group.params) {
      TESSERA_CHECK(param != nullptr, "{}: parameter '{}' is null", name_, param_name);
      TESSERA_CHECK(seen.insert(param.get()).second, "{}: parameter '{}' appears more than once", name_, param_name);
      TESSERA_CHECK(state_.emplace(param_name, ParamState{}).second, "{}: two parameters are named '{}'", name_,
                    param_name);
    }
  }
}

void Optimizer::step() { step_in_parts({}, nullptr); }

void Optimizer::step_in_parts(const std::vector<std::vector<const nn::Parameter*>>& parts,
                              const std::function<void(size_t part)>& after_part) {
  autograd::NoGradGuard no_grad;
  std::unordered_map<const nn::Parameter*, size_t> part_of;
  for (size_t part = 0; part < parts.size(); ++part) {
    for (const nn::Parameter* param : parts[part]) part_of.emplace(param, part);
  }
  // updates[i]: part i's; the last, the parameters in no part.
  std::vector<std::vector<ParamUpdate>> updates(parts.size() + 1);
  for (const ParamGroup& group : groups_) {
    for (const auto& [param_name, param] : group.params) {
      Tensor& tensor = param->tensor();
      const Tensor& grad = tensor.grad();
      if (!grad.defined()) continue;
      TESSERA_CHECK(steps_on(tensor.device()), "{}: parameter '{}' is on {}, which {} cannot step", name_, param_name,
                    tensor.device().str(), name_);
      TESSERA_CHECK(tensor.is_contiguous(), "{}: parameter '{}' is not contiguous", name_, param_name);
      TESSERA_CHECK(grad.device() == tensor.device(), "{}: gradient of '{}' is on {}, the parameter on {}", name_,
                    param_name, grad.device().str(), tensor.device().str());
      TESSERA_CHECK(grad.sizes() == tensor.sizes() && grad.dtype() == tensor.dtype(),
                    "{}: gradient of '{}' is {} {}, the parameter {} {}", name_, param_name, grad.sizes(),
                    dtype_name(grad.dtype()), tensor.sizes(), dtype_name(tensor.dtype()));
      TESSERA_CHECK(tensor.dtype() == DType::f32 || tensor.dtype() == DType::f64,
                    "{}: parameter '{}' is {}, only f32 and f64 are supported", name_, param_name,
                    dtype_name(tensor.dtype()));
      ParamState& param_state = state_.at(param_name);
      if (param_state.empty()) init_param_state(tensor, param_state);
      for (const auto& [key, value] : param_state) {
        TESSERA_CHECK(value.dim() == 0 || value.sizes() == tensor.sizes(),
                      "{}: state '{}' of '{}' has shape {}, the parameter {}", name_, key, param_name, value.sizes(),
                      tensor.sizes());
      }
      // A host step may not touch memory a device copy still uses (CPU
      // offload's shards and gradients); the simulator checks it.
      check_host_access(tensor, /*writes=*/true, "optimizer step");
      check_host_access(grad, /*writes=*/false, "optimizer step");
      const auto found = part_of.find(param.get());
      updates[found == part_of.end() ? parts.size() : found->second].push_back(
          ParamUpdate{&param_name, &tensor, ops::contiguous(grad), &param_state, &group});
    }
  }
  for (size_t part = 0; part < updates.size(); ++part) {
    if (!updates[part].empty()) update_all(updates[part]);
    if (part < parts.size() && after_part) after_part(part);
  }
  ++step_count_;
}

void Optimizer::update_all(const std::vector<ParamUpdate>& updates) {
  for (const ParamUpdate& one : updates) update(*one.param, one.grad, *one.state, *one.group);
}

void Optimizer::zero_grad() {
  for (const ParamGroup& group : groups_) {
    for (const auto& [param_name, param] : group.params) param->tensor().set_grad(Tensor());
  }
}

void Optimizer::set_lr(double lr) {
  TESSERA_CHECK(lr >= 0.0, "{}: lr must be >= 0, got {}", name_, lr);
  for (ParamGroup& group : groups_) group.lr = lr;
}

std::vector<std::string> Optimizer::param_names() const {
  std::vector<std::string> names;
  for (const ParamGroup& group : groups_) {
    for (const auto& [param_name, param] : group.params) names.push_back(param_name);
  }
  return names;
}

ParamState& Optimizer::state(std::string_view name) {
  auto it = state_.find(std::string(name));
  TESSERA_CHECK(it != state_.end(), "{}: no parameter named '{}'", name_, name);
  return it->second;
}

const ParamState& Optimizer::state(std::string_view name) const {
  auto it = state_.find(std::string(name));
  TESSERA_CHECK(it != state_.end(), "{}: no parameter named '{}'", name_, name);
  return it->second;
}

void Optimizer::init_state() {
  for (const ParamGroup& group : groups_) {
    for (const auto& [param_name, param] : group.params) {
      ParamState& param_state = state_.at(param_name);
      if (param_state.empty()) init_param_state(param->tensor(), param_state);
    }
  }
}

}  // namespace tessera::optim
