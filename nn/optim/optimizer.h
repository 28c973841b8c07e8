// optim::Optimizer: the base of SGD and AdamW. It holds parameter groups
// (each with its own lr and weight decay), steps every parameter that has a
// gradient under NoGradGuard on the parameter's current (local) tensor, and
// keeps per-parameter state by fully qualified name, so checkpoints can save
// and restore it by name.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "nn/module.h"

namespace tessera::optim {

struct ParamGroup {
  std::vector<nn::NamedParameter> params;
  // Unset: the optimizer's default, filled in at construction.
  std::optional<double> lr = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
};

// State of one parameter, like torch's optimizer.state[p]: AdamW has "step"
// (0-d i64), "exp_avg", "exp_avg_sq"; SGD has "step" and, with momentum,
// "momentum_buffer".
// Tensors have the parameter's (local) shape and dtype.
using ParamState = std::map<std::string, Tensor>;

// nanoGPT's split: tensors with dim >= 2 (matmul and embedding weights) get
// `weight_decay`; biases and norm weights (dim < 2) get none.
std::vector<ParamGroup> weight_decay_groups(const std::vector<nn::NamedParameter>& params, double weight_decay);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient; others are skipped.
  void step();
  // The same step, one part of the parameters at a time, in order, calling
  // `after_part(i)` once part i is updated; parameters in no part go last.
  // Each parameter's update is the one step() makes. CPU offload overlaps
  // this with the next forward (fsdp/offloaded_optimizer_step.h): a part
  // is an FSDP group, whose copy-in may start once it has stepped.
  void step_in_parts(const std::vector<std::vector<const nn::Parameter*>>& parts,
                     const std::function<void(size_t part)>& after_part);
  // Sets every gradient to none (undefined), freeing its memory.
  void zero_grad();

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Sets the lr of every group (what a schedule calls each step).
  void set_lr(double lr);

  // Parameter names in group order.
  std::vector<std::string> param_names() const;
  // The state of the parameter `name` (empty before its first step);
  // unknown names throw.
  ParamState& state(std::string_view name);
  const ParamState& state(std::string_view name) const;
  // Creates every parameter's state now (zeros, step 0), as the first step
  // would: a checkpoint loader fills it in place.
  void init_state();
  // Steps taken (calls to step()).
  int64_t step_count() const { return step_count_; }

 protected:
  Optimizer(std::vector<ParamGroup> groups, double default_lr, double default_weight_decay, std::string name);

  // One parameter of a step, checked: grad has its shape and dtype, is
  // contiguous, and the state exists.
  struct ParamUpdate {
    const std::string* name;
    Tensor* param;
    Tensor grad;
    ParamState* state;
    const ParamGroup* group;
  };

  // Creates the state of a parameter whose tensor is `param`.
  virtual void init_param_state(const Tensor& param, ParamState& state) const = 0;
  // Updates `param` in place from `grad` (same shape, contiguous, same dtype).
  virtual void update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) = 0;
  // Updates every parameter of a step; by default one update() each. An
  // optimizer with a multi-tensor kernel (AdamW) takes them all at once.
  virtual void update_all(const std::vector<ParamUpdate>& updates);
  // Devices whose parameters this optimizer can step (cpu by default).
  virtual bool steps_on(Device device) const { return device.is_cpu(); }

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<std::string, ParamState> state_;
  int64_t step_count_ = 0;
};

}  // namespace tessera::optim
