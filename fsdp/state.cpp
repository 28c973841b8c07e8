// fsdp::FSDPState: the hooks, the root's lazy init and its final callback.
#include "fsdp/state.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "fsdp/module_names.h"

namespace tessera::fsdp {

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
  std::shared_ptr<std::vector<FSDPParamGroup*>> outstanding_reduce_scatters;
  std::shared_ptr<FSDPStreams> streams;  // lazy_init's, or made with the first group, on its device
};

namespace {

// The deepest module that contains both (by name).
std::string common_ancestor(const std::string& a, const std::string& b) {
  std::string best;
  for (size_t end = 0; end <= a.size(); ++end) {
    if (end != a.size() && a[end] != '.') continue;
    const std::string prefix = a.substr(0, end);
    if (is_inside(b, prefix)) best = prefix;
  }
  return best;
}

// Parameter -> the state managing it, for fully_shard's bottom-up check.
std::mutex registry_mutex;
std::map<const nn::Parameter*, FSDPState*>& registry() {
  static std::map<const nn::Parameter*, FSDPState*> managed;
  return managed;
}

}  // namespace

FSDPState* managing_state(const nn::Parameter& param) {
  std::lock_guard lock(registry_mutex);
  const auto found = registry().find(&param);
  return found == registry().end() ? nullptr : found->second;
}

FSDPState::FSDPState(nn::Module& module, std::unique_ptr<FSDPParamGroup> group, dist::DeviceMesh mesh,
                     MixedPrecisionPolicy policy, std::optional<ReshardAfterForward> reshard_after_forward)
    : module_(&module),
      group_(std::move(group)),
      mesh_(std::move(mesh)),
      policy_(policy),
      reshard_after_forward_(reshard_after_forward) {
  hooks_.push_back(module_->register_forward_pre_hook(
      [this](nn::Module&, const nn::TensorList& inputs) { return pre_forward(inputs); }));
  hooks_.push_back(module_->register_forward_hook(
      [this](nn::Module&, const nn::TensorList&, const Tensor& output) { return post_forward(output); }));
  if (group_ == nullptr) return;
  std::lock_guard lock(registry_mutex);
  for (const auto& param : group_->params()) registry()[&param->param()] = this;
}

FSDPState::~FSDPState() {
  if (group_ == nullptr) return;
  std::lock_guard lock(registry_mutex);
  for (const auto& param : group_->params()) registry().erase(&param->param());
}

// FSDP phases go to the shard group's tracer, beside its collectives.
dist::Tracer* FSDPState::tracer() const { return mesh_.group(mesh_.ndim() - 1)->tracer().get(); }

int FSDPState::trace_rank() const {
  const auto& group = mesh_.group(mesh_.ndim() - 1);
  return group->world_ranks()[static_cast<size_t>(group->rank())];
}

const std::vector<FSDPState*>& FSDPState::tree() const {
  TESSERA_CHECK(context_ != nullptr, "fsdp: the module tree of '{}' is known after the root's first forward",
                module_->type_name());
  return context_->states;
}

std::vector<FSDPState*> FSDPState::forward_order() const {
  std::vector<FSDPState*> order =
      context_ != nullptr && context_->forward_order_recorded ? context_->pre_forward_order : std::vector<FSDPState*>{};
  for (FSDPState* state : tree()) {
    if (std::find(order.begin(), order.end(), state) == order.end()) order.push_back(state);
  }
  return order;
}

MemoryStats FSDPState::unsharded_memory(bool recurse) const {
  const std::shared_ptr<MemoryCounters>& counters = recurse ? subtree_memory_ : own_memory_;
  return counters ? counters->snapshot() : MemoryStats{};
}

void FSDPState::reset_unsharded_memory_peak(bool recurse) {
  if (own_memory_ == nullptr) return;
  own_memory_->reset_peak();
  if (!recurse) return;
  for (FSDPState* state : context_->states) {
    if (state->subtree_memory_ && is_inside(state->fqn_, fqn_)) {
      state->own_memory_->reset_peak();
      state->subtree_memory_->reset_peak();
    }
  }
}

// ---- lazy init ---------------------------------------------------------------------------------

void FSDPState::lazy_init(std::shared_ptr<FSDPStreams> streams) {
  TESSERA_CHECK(context_ == nullptr || streams == nullptr,
                "fsdp: lazy_init of '{}' was given streams, but its root's lazy init has run; streams are chosen "
                "there, once, before the first forward", module_->type_name());
  if (context_ != nullptr) return;
  auto context = std::make_shared<FSDPStateContext>();
  context->outstanding_reduce_scatters = std::make_shared<std::vector<FSDPParamGroup*>>();
  context->streams = std::move(streams);

  // Every registry slot of every parameter, by module name: tied parameters
  // show up in more than one.
  std::map<const nn::Parameter*, std::vector<std::pair<std::string, std::string>>> slots;
  for (const auto& [module_fqn, module] : module_->named_modules()) {
    for (const auto& [name, parameter] : module->named_parameters(/*recurse=*/false)) {
      slots[parameter.get()].emplace_back(module_fqn, join_name(module_fqn, name));
    }
    FSDPState* state = module->extension<FSDPState>();
    if (state == nullptr) continue;
    TESSERA_CHECK(state == this || !state->is_root_,
                  "fsdp: module '{}' already ran forward as an FSDP root; the outermost FSDP module ('{}') must run "
                  "the first forward", module_fqn, module_->type_name());
    TESSERA_CHECK(state == this || state->is_last_backward_,
                  "fsdp: set_is_last_backward(false) was called on '{}' ({}), which is not the FSDP root; the root's "
                  "backward decides, so call it on the root", module_fqn, module->type_name());
    state->context_ = context;
    state->fqn_ = module_fqn;
    state->is_root_ = state == this;
    context->states.push_back(state);
  }

  // Memory counters nest as the modules do: pre-order puts every enclosing
  // state before the states inside it, the deepest last.
  for (size_t index = 0; index < context->states.size(); ++index) {
    FSDPState* state = context->states[index];
    std::shared_ptr<MemoryCounters> parent = MemoryScope::current();
    for (size_t outer = 0; outer < index; ++outer) {
      if (is_inside(state->fqn_, context->states[outer]->fqn_)) parent = context->states[outer]->subtree_memory_;
    }
    state->subtree_memory_ = std::make_shared<MemoryCounters>(std::move(parent));
    state->own_memory_ = std::make_shared<MemoryCounters>(state->subtree_memory_);
  }

  for (FSDPState* state : context->states) {
    FSDPParamGroup* group = state->group_.get();
    if (group == nullptr) continue;
    if (!context->streams) {
      context->streams = std::make_shared<FSDPStreams>(group->device());
    }
    group->set_module_fqn(state->fqn_);
    for (const auto& param : group->params()) {
      const auto& uses = slots[&param->param()];
      // The parameter's own name: its first slot inside the module that manages it.
      auto own = std::find_if(uses.begin(), uses.end(), [&](const auto& use) { return is_inside(use.first, state->fqn_); });
      if (own != uses.end()) param->set_fqn(own->second);
      for (const auto& [use_module, use_name] : uses) {
        if (is_inside(use_module, state->fqn_)) continue;
        const std::string where = state->fqn_.empty() ? std::string("the root") : "'" + state->fqn_ + "'";
        const std::string ancestor = common_ancestor(state->fqn_, use_module);
        fail("fsdp: parameter '{}' is tied to '{}', which is outside {}, the module fully_shard put it in; tied "
             "parameters must live in one group: call fully_shard on a module that contains both ({}) instead of "
             "on {}",
             param->fqn(), use_name, where, ancestor.empty() ? std::string("the root") : "'" + ancestor + "'", where);
      }
    }
    group->set_reshard_after_forward(state->reshard_after_forward_.value_or(
        state->is_root_ ? ReshardAfterForward::never() : ReshardAfterForward::always()));
    group->lazy_init(state->own_memory_, context->outstanding_reduce_scatters, context->streams, [state] {
      if (autograd::in_backward()) state->queue_final_callback();
    });
  }
}

// ---- forward ---------------------------------------------------------------------------------------

std::optional<nn::TensorList> FSDPState::pre_forward(const nn::TensorList& inputs) {
  lazy_init();
  ++forward_depth_;
  forward_start_us_ = dist::Tracer::now_us();
  if (group_ != nullptr) {
    record_once(context_->pre_forward_order);
    group_->pre_forward();
    if (forward_prefetch_) {
      prefetch(*forward_prefetch_);
    } else if (FSDPState* next = neighbour_in(context_->pre_forward_order, +1)) {
      prefetch({next});
    }
  }
  std::optional<nn::TensorList> forwarded;
  if (group_ != nullptr && group_->has_frozen_parameters() && autograd::GradMode::is_enabled()) {
    forwarded = through_post_backward(inputs);
  }
  if (!policy_.cast_forward_inputs || !policy_.param_dtype) return forwarded;
  nn::TensorList cast = forwarded.value_or(inputs);
  for (Tensor& input : cast) {
    if (input.defined() && is_floating(input.dtype())) input = tessera::to(input, *policy_.param_dtype);
  }
  return cast;
}

std::optional<Tensor> FSDPState::post_forward(const Tensor& output) {
  const bool backward_follows = autograd::GradMode::is_enabled() && output.defined() && output.requires_grad();
  if (group_ != nullptr) {
    record_once(context_->post_forward_order);
    group_->post_forward(backward_follows);
  }
  --forward_depth_;
  if (is_root_ && forward_depth_ == 0) context_->forward_order_recorded = true;
  if (dist::Tracer* trace = tracer()) {
    trace->record(dist::TraceEvent{.rank = trace_rank(), .track = "fsdp", .name = "forward", .category = "fsdp",
                                   .start_us = forward_start_us_,
                                   .duration_us = dist::Tracer::now_us() - forward_start_us_,
                                   .args = {{"module", fqn_}}});
  }

  Tensor result = output;
  if (backward_follows && !result.is_leaf()) {
    autograd::register_hook(result, [this](const Tensor&) {
      pre_backward();
      return Tensor();
    });
  }
  if (policy_.output_dtype && result.defined() && is_floating(result.dtype()) && result.dtype() != *policy_.output_dtype) {
    result = tessera::to(result, *policy_.output_dtype);
  }
  return result;
}

namespace {

// The identity on a module's inputs, whose backward runs once their
// gradients are complete: the module's backward is done then (FSDP2's
// RegisterPostBackwardFunction). Being a node of its own inside the module,
// it runs before any hook on the inputs themselves, such as the pre-backward
// of the module that produced them: this group reshards before that one
// unshards and prefetches.
class PostBackwardOnInputs final : public autograd::Function {
 public:
  explicit PostBackwardOnInputs(FSDPParamGroup* group) : group_(group) {}
  nn::TensorList forward(autograd::FunctionContext&, const nn::TensorList& inputs) override {
    nn::TensorList aliases;
    for (const Tensor& input : inputs) aliases.push_back(ops::view(input, input.sizes()));
    return aliases;
  }
  nn::TensorList backward(autograd::FunctionContext&, const nn::TensorList& gradients) override {
    group_->on_input_gradient();
    return gradients;
  }
  std::string name() const override { return "FSDPPostBackwardOnInputs"; }

 private:
  FSDPParamGroup* group_;
};

}  // namespace

std::optional<nn::TensorList> FSDPState::through_post_backward(const nn::TensorList& inputs) {
  std::vector<size_t> wanting;  // the inputs that will get a gradient
  nn::TensorList routed;
  for (size_t index = 0; index < inputs.size(); ++index) {
    if (inputs[index].defined() && inputs[index].requires_grad()) {
      wanting.push_back(index);
      routed.push_back(inputs[index]);
    }
  }
  if (wanting.empty()) return std::nullopt;  // nothing to wait for: the end of the pass reshards
  group_->expect_input_gradient();
  routed = autograd::Function::apply<PostBackwardOnInputs>(routed, group_.get());
  nn::TensorList forwarded = inputs;
  for (size_t position = 0; position < wanting.size(); ++position) forwarded[wanting[position]] = routed[position];
  return forwarded;
}

// ---- backward --------------------------------------------------------------------------------------

void FSDPState::queue_final_callback() {
  if (context_->final_callback_queued) return;
  FSDPState* root = context_->states.front();
  autograd::queue_callback([root] { root->root_post_backward_final(); });
  context_->final_callback_queued = true;
}

void FSDPState::pre_backward() {
  queue_final_callback();
  if (group_ == nullptr) return;
  group_->pre_backward();
  if (backward_prefetch_) {
    prefetch(*backward_prefetch_);
  } else if (FSDPState* previous = neighbour_in(context_->post_forward_order, -1)) {
    prefetch({previous});
  }
}

void FSDPState::root_post_backward_final() {
  context_->final_callback_queued = false;
  for (FSDPState* state : context_->states) {
    if (state->group_ != nullptr) state->group_->finish_backward(is_last_backward_);
  }
}

void FSDPState::prefetch(const std::vector<FSDPState*>& targets) {
  for (FSDPState* target : targets) {
    TESSERA_CHECK(target->context_ == context_, "fsdp: '{}' ({}) prefetches a {} that is not in its FSDP root's tree; "
                  "set_modules_to_*_prefetch takes modules of the same model", fqn_, module_->type_name(),
                  target->module_->type_name());
    if (target != this && target->group_ != nullptr) target->group_->unshard(/*async_op=*/true);
  }
}

void FSDPState::record_once(std::vector<FSDPState*>& order) {
  if (context_->forward_order_recorded || std::find(order.begin(), order.end(), this) != order.end()) return;
  order.push_back(this);
}

FSDPState* FSDPState::neighbour_in(const std::vector<FSDPState*>& order, int step) const {
  if (!context_->forward_order_recorded) return nullptr;
  const auto here = std::find(order.begin(), order.end(), this);
  if (here == order.end()) return nullptr;
  const auto index = (here - order.begin()) + step;
  if (index < 0 || index >= static_cast<std::ptrdiff_t>(order.size())) return nullptr;
  return order[static_cast<size_t>(index)];
}

}  // namespace tessera::fsdp
