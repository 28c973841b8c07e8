// optim::AdamW: the host's part of a step (step counts, bias corrections,
// checks), then one adamw_step kernel-table call per device.
#include "nn/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "tensor/kernels.h"
#include "tensor/ops.h"

namespace tessera::optim {

namespace {

void check_options(const AdamWOptions& options) {
  TESSERA_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0, "AdamW: beta1 must be in [0, 1), got {}", options.beta1);
  TESSERA_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, "AdamW: beta2 must be in [0, 1), got {}", options.beta2);
  TESSERA_CHECK(options.eps >= 0.0, "AdamW: eps must be >= 0, got {}", options.eps);
}

// Advances the parameter's step (a cpu i64 in its state) and folds the bias
// corrections into two scalars: lr / (1 - b1^t) and 1 / sqrt(1 - b2^t).
AdamWTensor prepare(const AdamWOptions& options, Tensor& param, const Tensor& grad, ParamState& state,
                    const ParamGroup& group, const Tensor& working_copy) {
  Tensor& step_tensor = state.at("step");
  Tensor& exp_avg = state.at("exp_avg");
  Tensor& exp_avg_sq = state.at("exp_avg_sq");
  TESSERA_CHECK(step_tensor.dtype() == DType::i64 && step_tensor.numel() == 1 && step_tensor.device().is_cpu(),
                "AdamW: state 'step' must be a one-element i64 cpu tensor");
  TESSERA_CHECK(exp_avg.is_contiguous() && exp_avg_sq.is_contiguous() && exp_avg.dtype() == param.dtype() &&
                    exp_avg_sq.dtype() == param.dtype(),
                "AdamW: moments must be contiguous and of the parameter's dtype ({})", dtype_name(param.dtype()));
  TESSERA_CHECK(exp_avg.device() == param.device() && exp_avg_sq.device() == param.device(),
                "AdamW: moments on {} and {}, the parameter on {}", exp_avg.device().str(),
                exp_avg_sq.device().str(), param.device().str());
  const int64_t step = ++step_tensor.data_ptr<int64_t>()[0];
  const double lr = *group.lr, weight_decay = *group.weight_decay;
  return AdamWTensor{
      .param = param,
      .grad = grad,
      .exp_avg = exp_avg,
      .exp_avg_sq = exp_avg_sq,
      .working_copy = working_copy,
      .decay = 1.0 - lr * weight_decay,
      .step_size = lr / (1.0 - std::pow(options.beta1, static_cast<double>(step))),
      .inv_sqrt_bias2 = 1.0 / std::sqrt(1.0 - std::pow(options.beta2, static_cast<double>(step))),
  };
}

}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay, "AdamW"), options_(options) {
  check_options(options_);
}

AdamW::AdamW(const std::vector<nn::NamedParameter>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{.params = params, .lr = std::nullopt, .weight_decay = std::nullopt}},
            options) {}

void AdamW::set_working_copy(std::string_view name, Tensor working_copy) {
  state(name);  // the name must be one of ours
  TESSERA_CHECK(working_copy.defined() && working_copy.dtype() == DType::bf16 && working_copy.is_contiguous(),
                "AdamW: the working copy of '{}' must be a contiguous bf16 tensor, got {}", name,
                working_copy.defined() ? dtype_name(working_copy.dtype()) : "an undefined tensor");
  working_copies_[std::string(name)] = std::move(working_copy);
}

void AdamW::init_param_state(const Tensor& param, ParamState& state) const {
  state["step"] = ops::scalar_tensor(0, {.dtype = DType::i64});
  state["exp_avg"] = ops::zeros_like(param);
  state["exp_avg_sq"] = ops::zeros_like(param);
}

void AdamW::update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) {
  kernels(param.device()).adamw_step({prepare(options_, param, grad, state, group, Tensor())},
                                     {.beta1 = options_.beta1, .beta2 = options_.beta2, .eps = options_.eps});
}

// Every parameter of a device in one kernel-table call, devices in the order
// they first appear.
void AdamW::update_all(const std::vector<ParamUpdate>& updates) {
  std::vector<std::pair<Device, std::vector<AdamWTensor>>> by_device;
  for (const ParamUpdate& one : updates) {
    const auto working = working_copies_.find(*one.name);
    const Tensor working_copy = working == working_copies_.end() ? Tensor() : working->second;
    if (working_copy.defined()) {
      TESSERA_CHECK(working_copy.sizes() == one.param->sizes() && working_copy.device() == one.param->device(),
                    "AdamW: the working copy of '{}' is {} on {}, the parameter {} on {}", *one.name,
                    working_copy.sizes(), working_copy.device().str(), one.param->sizes(),
                    one.param->device().str());
    }
    const Device device = one.param->device();
    auto slot = std::find_if(by_device.begin(), by_device.end(), [&](const auto& entry) { return entry.first == device; });
    if (slot == by_device.end()) slot = by_device.insert(by_device.end(), {device, {}});
    slot->second.push_back(prepare(options_, *one.param, one.grad, *one.state, *one.group, working_copy));
  }
  for (const auto& [device, tensors] : by_device) {
    kernels(device).adamw_step(tensors, {.beta1 = options_.beta1, .beta2 = options_.beta2, .eps = options_.eps});
  }
}

}  // namespace tessera::optim
