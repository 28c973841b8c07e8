// fsdp::FSDPState: the hooks, the root's lazy init and its final callback.
#include "fsdp/state.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"

namespace tessera::fsdp {

namespace {

bool is_inside(const std::string& module_fqn, const std::string& ancestor_fqn) {
  return ancestor_fqn.empty() || module_fqn == ancestor_fqn ||
         (module_fqn.size() > ancestor_fqn.size() && module_fqn.compare(0, ancestor_fqn.size(), ancestor_fqn) == 0 &&
          module_fqn[ancestor_fqn.size()] == '.');
}

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

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
                     MixedPrecisionPolicy policy, std::optional<int64_t> reshard_after_forward)
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

// ---- lazy init ---------------------------------------------------------------------------------

void FSDPState::lazy_init() {
  if (context_ != nullptr) return;
  auto context = std::make_shared<FSDPStateContext>();
  context->unsharded_memory = std::make_shared<MemoryCounters>(MemoryScope::current());
  context->outstanding_reduce_scatters = std::make_shared<std::vector<FSDPParamGroup*>>();

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
    state->context_ = context;
    state->fqn_ = module_fqn;
    state->is_root_ = state == this;
    context->states.push_back(state);
  }

  for (FSDPState* state : context->states) {
    FSDPParamGroup* group = state->group_.get();
    if (group == nullptr) continue;
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
    const int64_t shards = group->comm().shard->size();
    group->set_post_forward_shards(state->reshard_after_forward_.value_or(state->is_root_ ? 1 : shards));
    group->lazy_init(context->unsharded_memory, context->outstanding_reduce_scatters, [state] {
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
    if (forward_prefetch) {
      prefetch(*forward_prefetch);
    } else if (FSDPState* next = neighbour_in(context_->pre_forward_order, +1)) {
      prefetch({next});
    }
  }
  if (!policy_.cast_forward_inputs || !policy_.param_dtype) return std::nullopt;
  nn::TensorList cast = inputs;
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
  if (backward_prefetch) {
    prefetch(*backward_prefetch);
  } else if (FSDPState* previous = neighbour_in(context_->post_forward_order, -1)) {
    prefetch({previous});
  }
}

void FSDPState::root_post_backward_final() {
  context_->final_callback_queued = false;
  for (FSDPState* state : context_->states) {
    if (state->group_ != nullptr) state->group_->finish_backward(is_last_backward);
  }
}

void FSDPState::prefetch(const std::vector<FSDPState*>& targets) {
  for (FSDPState* target : targets) {
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
