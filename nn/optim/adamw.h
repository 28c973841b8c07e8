// optim::AdamW: Adam with decoupled weight decay (Loshchilov & Hutter), as
// torch.optim.AdamW. Per element, at step t:
//   p *= 1 - lr * wd
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// A step is one kernel-table call per device over every parameter
// (adamw_step): on cpu one fused pass per tensor split across threads, on
// cuda one multi-tensor launch per 40 tensors. The step counts and bias
// corrections stay on the host, so a step never reads the device.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

#include "nn/optim/optimizer.h"

namespace tessera::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  AdamW(const std::vector<nn::NamedParameter>& params, AdamWOptions options = {});

  const AdamWOptions& options() const { return options_; }

  // Mixed precision: `working_copy` (bf16, the parameter's shape and device)
  // receives the parameter rounded to bf16 by the same kernel at every step,
  // so the f32 master and its bf16 copy never take a separate cast.
  void set_working_copy(std::string_view name, Tensor working_copy);

 protected:
  void init_param_state(const Tensor& param, ParamState& state) const override;
  void update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) override;
  void update_all(const std::vector<ParamUpdate>& updates) override;
  bool steps_on(Device device) const override { return device.is_cpu() || device.is_cuda(); }

 private:
  AdamWOptions options_;
  std::unordered_map<std::string, Tensor> working_copies_;
};

}  // namespace tessera::optim
