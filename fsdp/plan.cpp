// fsdp::ShardingPlan: the groups of a live FSDP tree or of a list of
// fully_shard calls, their flat layouts over a mesh's sizes, a training
// step's unsharded memory replayed group by group, the step's collectives,
// and the plan as text.
#include "fsdp/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <optional>
#include <set>

#include "dist/comm_stats.h"
#include "dist/dtensor.h"
#include "fsdp/fsdp_param.h"
#include "fsdp/module_names.h"
#include "fsdp/param_group.h"
#include "fsdp/state.h"

namespace tessera::fsdp {

namespace {

int64_t bytes_of(DType dtype, int64_t numel) { return numel * static_cast<int64_t>(element_size(dtype)); }

std::string quoted_module(const std::string& fqn) { return fqn.empty() ? std::string("the root") : "'" + fqn + "'"; }

// ---- layouts -------------------------------------------------------------------------------------

// One rank's all-gather slot in bytes: the padded chunks in param_dtype, or
// with all-gather extensions the payloads they say, laid out as the group
// lays them out (payload_slot_layout).
int64_t all_gather_slot_bytes(const PlannedUnit& unit) {
  const bool extended = std::any_of(unit.params.begin(), unit.params.end(),
                                    [](const PlannedParam& param) { return param.all_gather_extension != nullptr; });
  if (!extended) return bytes_of(unit.param_dtype, unit.slot_numel);
  std::vector<nn::PayloadSize> payloads;
  for (const PlannedParam& param : unit.params) {
    if (!param.all_gather_extension) {
      payloads.push_back({unit.param_dtype, param.padded_rows * param.row_numel()});
      continue;
    }
    Shape padded_shape = param.global_shape;
    padded_shape.at(0) = param.padded_rows;
    for (const nn::PayloadSize& payload :
         param.all_gather_extension->payload_sizes(padded_shape, param.dtype, unit.param_dtype)) {
      payloads.push_back(payload);
    }
  }
  return payload_slot_layout(payloads).slot_bytes();
}

// The flat layout of `unit`'s parameters over `mesh` (FlatLayout in
// param_group.h), from FSDP's dim-0 split: every parameter's padded chunk,
// over the shard group and over reshard_after_forward's N ranks.
void lay_out(PlannedUnit& unit, const PlanMesh& mesh) {
  const std::optional<int64_t> post_forward_ranks = unit.reshard_after_forward.group_size();
  for (PlannedParam& param : unit.params) {
    param.padded_rows = padded_shard_rows(param.rows(), mesh.shard);
    param.padding_rows = param.padded_rows * mesh.shard - param.rows();
    unit.slot_numel += param.padded_rows * param.row_numel();
    if (post_forward_ranks) {
      unit.post_forward_slot_numel += padded_shard_rows(param.rows(), *post_forward_ranks) * param.row_numel();
    }
    if (const auto& extension = param.all_gather_extension) {
      unit.unsharded_bytes += bytes_of(extension->unsharded_dtype(unit.param_dtype),
                                       shape_numel(extension->unsharded_shape(param.global_shape)));
    } else {
      unit.unsharded_bytes += bytes_of(unit.param_dtype, param.numel());
    }
    if (!param.requires_grad) continue;  // frozen: no place in the gradient slot
    unit.gradient_slot_numel += param.padded_rows * param.row_numel();
    unit.gradient_flags += 1;
    if (param.partial_gradient) unit.partial_gradient_numel += param.padded_rows * param.row_numel();
  }
  unit.all_gather_slot_bytes = all_gather_slot_bytes(unit);
  unit.all_gather_buffer_bytes = mesh.shard * unit.all_gather_slot_bytes;
  if (post_forward_ranks) {
    unit.post_forward_buffer_bytes = bytes_of(unit.param_dtype, *post_forward_ranks * unit.post_forward_slot_numel);
  }
}

// Each unit's enclosing unit: the nearest one before it (pre-order) whose
// module contains it.
void link_parents(std::vector<PlannedUnit>& units) {
  for (size_t index = 1; index < units.size(); ++index) {
    for (size_t outer = index; outer-- > 0;) {
      if (is_inside(units[index].fqn, units[outer].fqn)) {
        units[index].parent = static_cast<int>(outer);
        break;
      }
    }
  }
}

// ---- the step's unsharded memory -------------------------------------------------------------------

// One training step (forward, backward, gradients synced) replayed as the
// FSDPStates drive their groups (state.cpp) and as each group allocates and
// frees its unsharded memory (param_group.cpp), keeping the highest total.
class StepReplay {
 public:
  explicit StepReplay(const std::vector<PlannedUnit>& units) : units_(units), groups_(units.size()) {
    children_.resize(units.size());
    for (size_t index = 0; index < units.size(); ++index) {
      groups_[index].holding.unit = units[index].label();
      if (units[index].parent >= 0) children_[static_cast<size_t>(units[index].parent)].push_back(index);
      if (units[index].has_group()) pre_forward_order_.push_back(index);
    }
    if (!units.empty()) record_post_forward_order(0);
  }

  UnshardedPeak run() {
    if (units_.empty()) return {};
    phase_ = "forward";
    forward(0);
    phase_ = "backward";
    backward(0);
    for (size_t index : untrainable_) reshard(index, State::sharded);  // the root's final callback
    return peak_;
  }

 private:
  enum class State { sharded, sharded_post_forward, unsharded };
  struct Group {
    State state = State::sharded;
    bool all_gather_pending = false;
    UnshardedHolding holding;
  };

  // Post-forward order: a module's forward ends after those inside it.
  void record_post_forward_order(size_t index) {
    for (size_t child : children_[index]) record_post_forward_order(child);
    if (units_[index].has_group()) post_forward_order_.push_back(index);
  }

  // Sets one of a holding's amounts and notes a new peak.
  void charge(int64_t& amount, int64_t bytes, const std::string& moment) {
    live_ += bytes - amount;
    amount = bytes;
    if (live_ <= peak_.bytes) return;
    peak_.bytes = live_;
    peak_.moment = moment;
    peak_.holdings.clear();
    for (const Group& group : groups_) {
      if (group.holding.total() > 0) peak_.holdings.push_back(group.holding);
    }
  }

  // FSDPParamGroup::unshard: allocate the all-gather output (a post-forward
  // group's slot is copied into it and freed).
  void unshard(size_t index, const std::string& moment) {
    const PlannedUnit& unit = units_[index];
    Group& group = groups_[index];
    if (!unit.has_group() || group.state == State::unsharded || group.all_gather_pending) return;
    const bool from_post_forward = group.state == State::sharded_post_forward;
    charge(group.holding.all_gather_buffer,
           from_post_forward ? unit.post_forward_buffer_bytes : unit.all_gather_buffer_bytes, moment);
    if (from_post_forward) charge(group.holding.post_forward_shard, 0, moment);
    group.all_gather_pending = true;
  }

  // FSDPParamGroup::wait_for_unshard: the copy-out allocates the unsharded
  // parameters while the all-gather output is still live, then frees it.
  void wait_for_unshard(size_t index) {
    const PlannedUnit& unit = units_[index];
    Group& group = groups_[index];
    if (group.state == State::unsharded && !group.all_gather_pending) return;
    if (!group.all_gather_pending) unshard(index, fmt::format("the all-gather of {} in {}", unit.label(), phase_));
    charge(group.holding.parameters, unit.unsharded_bytes,
           fmt::format("the copy-out of {} in {}", unit.label(), phase_));
    charge(group.holding.all_gather_buffer, 0, "");
    group.all_gather_pending = false;
    group.state = State::unsharded;
  }

  // FSDPParamGroup::reshard: to the post-forward shard (allocated while the
  // unsharded parameters are live) or fully.
  void reshard(size_t index, State target) {
    const PlannedUnit& unit = units_[index];
    Group& group = groups_[index];
    if (group.all_gather_pending) {
      charge(group.holding.all_gather_buffer, 0, "");
      group.all_gather_pending = false;
    }
    const bool to_post_forward = target == State::sharded_post_forward && unit.post_forward_slot_numel > 0;
    if (group.state == State::unsharded) {
      if (to_post_forward) {
        charge(group.holding.post_forward_shard, bytes_of(unit.param_dtype, unit.post_forward_slot_numel),
               fmt::format("the post-forward reshard of {} (its rows of a {}-way sharding)", unit.label(),
                           unit.reshard_after_forward.to_string()));
      }
      charge(group.holding.parameters, 0, "");
    } else if (group.state == State::sharded_post_forward && !to_post_forward) {
      charge(group.holding.post_forward_shard, 0, "");
    } else if (group.state == State::sharded) {
      return;
    }
    group.state = to_post_forward ? State::sharded_post_forward : State::sharded;
  }

  // FSDPState's default prefetch: the neighbour in a recorded order.
  std::optional<size_t> neighbour(const std::vector<size_t>& order, size_t index, int step) const {
    const auto here = std::find(order.begin(), order.end(), index);
    if (here == order.end()) return std::nullopt;
    const auto at = (here - order.begin()) + step;
    if (at < 0 || at >= static_cast<std::ptrdiff_t>(order.size())) return std::nullopt;
    return order[static_cast<size_t>(at)];
  }

  void prefetch(size_t index, const std::vector<size_t>& order, int step) {
    if (const std::optional<size_t> target = neighbour(order, index, step)) {
      const std::string moment =
          fmt::format("{}'s prefetch of {} in {}", units_[index].label(), units_[*target].label(), phase_);
      unshard(*target, moment);
    }
  }

  void forward(size_t index) {
    const PlannedUnit& unit = units_[index];
    if (unit.has_group()) {
      wait_for_unshard(index);
      prefetch(index, pre_forward_order_, +1);
    }
    for (size_t child : children_[index]) forward(child);
    if (!unit.has_group()) return;
    if (unit.reshard_after_forward.is_always()) {
      reshard(index, State::sharded);
    } else if (unit.reshard_after_forward.group_size()) {
      reshard(index, State::sharded_post_forward);
    }
  }

  // Backward reaches a module's output after everything that ran after it;
  // its group reshards once its gradients are done: after the modules inside
  // it (their inputs' gradients come first). A group without trainable
  // parameters waits for the end of the pass.
  void backward(size_t index) {
    const PlannedUnit& unit = units_[index];
    if (unit.has_group()) {
      wait_for_unshard(index);
      prefetch(index, post_forward_order_, -1);
    }
    for (auto child = children_[index].rbegin(); child != children_[index].rend(); ++child) backward(*child);
    if (!unit.has_group()) return;
    if (unit.has_trainable_parameters()) {
      reshard(index, State::sharded);
    } else {
      untrainable_.push_back(index);
    }
  }

  const std::vector<PlannedUnit>& units_;
  std::vector<Group> groups_;
  std::vector<std::vector<size_t>> children_;
  std::vector<size_t> pre_forward_order_;
  std::vector<size_t> post_forward_order_;
  std::vector<size_t> untrainable_;
  const char* phase_ = "forward";
  int64_t live_ = 0;
  UnshardedPeak peak_;
};

// The per-rank totals and the peak of `units` laid out over `mesh`.
ShardingPlan assemble(std::string model_type, const PlanMesh& mesh, std::vector<PlannedUnit> units) {
  ShardingPlan plan;
  plan.model_type = std::move(model_type);
  plan.mesh = mesh;
  link_parents(units);
  for (const PlannedUnit& unit : units) {
    for (const PlannedParam& param : unit.params) {
      plan.parameters += param.numel();
      plan.tensors += 1;
      plan.shard_bytes += param.shard_bytes();
      plan.padding_bytes += bytes_of(param.dtype, param.padding_rows * param.row_numel());
      const int64_t gradient_bytes =
          param.requires_grad ? bytes_of(param.dtype, param.rank0_rows() * param.row_numel()) : 0;
      plan.gradient_bytes += gradient_bytes;
      if (unit.offloaded) {
        plan.offloaded_shard_bytes += param.shard_bytes();
        plan.offloaded_gradient_bytes += gradient_bytes;
      }
    }
    plan.all_groups_unsharded_bytes += unit.unsharded_bytes;
    for (const PlannedParam& param : unit.params) {
      if (param.requires_grad) plan.accumulated_gradient_bytes += bytes_of(unit.param_dtype, param.numel());
    }
  }
  plan.units = std::move(units);
  plan.peak = StepReplay(plan.units).run();
  return plan;
}

// ---- tensor parallelism ----------------------------------------------------------------------------

// "Shard(0)", "Shard(0) x 3 sections", "Replicate", "Replicate, partial gradients".
std::string placement_text(const nn::TensorParallelSpec& spec) {
  if (spec.shard_dim() < 0) return spec.partial_gradient ? "Replicate, partial gradients" : "Replicate";
  const std::string shard = dist::placement_name(spec.placement);
  return spec.sections == 1 ? shard : fmt::format("{} x {} sections", shard, spec.sections);
}

// The planned parameter of `parameter` (whole, or this rank's tp piece):
// what FSDP shards, and under tensor parallelism the piece's placement.
PlannedParam planned_param(const std::string& fqn, const nn::Parameter& parameter, const Shape& sharded_shape,
                           DType dtype) {
  PlannedParam param{.fqn = fqn,
                     .global_shape = sharded_shape,
                     .logical_shape = sharded_shape,
                     .tensor_parallel = "",
                     .partial_gradient = false,
                     .dtype = dtype,
                     .requires_grad = parameter.requires_grad(),
                     .padded_rows = 0,
                     .padding_rows = 0,
                     .all_gather_extension = parameter.all_gather_extension()};
  if (const auto& spec = parameter.tensor_parallel()) {
    param.logical_shape = spec->global_shape;
    param.tensor_parallel = placement_text(*spec);
    param.partial_gradient = spec->partial_gradient;
  }
  return param;
}

// The tp size the parameters of `root` are laid out over (1 without tensor
// parallelism).
int64_t tensor_parallel_size(nn::Module& root) {
  for (const auto& parameter : root.parameters()) {
    if (const auto& spec = parameter->tensor_parallel()) return spec->mesh.size();
  }
  return 1;
}

// ---- units from fully_shard calls -----------------------------------------------------------------

// Where the modules and parameters of the root's tree are.
struct ModuleTree {
  std::map<const nn::Module*, std::pair<size_t, std::string>> modules;  // pre-order index and name
  // Every slot of every parameter: (module name, parameter name); tied ones have several.
  std::map<const nn::Parameter*, std::vector<std::pair<std::string, std::string>>> slots;
};

ModuleTree read_tree(nn::Module& root) {
  ModuleTree tree;
  for (const auto& [fqn, module] : root.named_modules()) {
    tree.modules.emplace(module, std::make_pair(tree.modules.size(), fqn));
    for (const auto& [name, parameter] : module->named_parameters(/*recurse=*/false)) {
      tree.slots[parameter.get()].emplace_back(fqn, join_name(fqn, name));
    }
  }
  return tree;
}

// The group fully_shard(call.module, call.options) would make, given the
// parameters earlier calls claimed (parameter -> the claiming module's name).
PlannedUnit unit_of_call(const PlannedCall& call, const std::string& fqn, bool is_root, const PlanMesh& mesh,
                         const ModuleTree& tree, std::map<const nn::Parameter*, std::string>& claimed) {
  const std::string where = fmt::format("plan_fully_shard({} {})", call.module->type_name(), quoted_module(fqn));
  PlannedUnit unit;
  unit.fqn = fqn;
  unit.module_type = call.module->type_name();
  std::set<const nn::Parameter*> ignored;
  for (const auto& parameter : call.options.ignored_params) ignored.insert(parameter.get());

  for (const auto& [name, parameter] : call.module->named_parameters()) {
    const std::string parameter_fqn = join_name(fqn, name);
    if (const auto found = claimed.find(parameter.get()); found != claimed.end()) {
      TESSERA_CHECK(is_inside(found->second, fqn),
                    "{}: parameter '{}' is already in the group of {}, which is not inside this module; apply "
                    "fully_shard bottom-up (blocks first, then the root), and keep tied parameters in one module's "
                    "call",
                    where, parameter_fqn, quoted_module(found->second));
      continue;  // managed by a call below this one
    }
    if (ignored.count(parameter.get()) > 0) continue;
    const Tensor& tensor = parameter->tensor();
    TESSERA_CHECK(tensor.dim() >= 1, "{}: parameter '{}' is 0-d; dim-0 sharding needs dim >= 1 (pass it in "
                  "ignored_params to keep it whole)", where, parameter_fqn);
    TESSERA_CHECK(is_floating(tensor.dtype()) || parameter->all_gather_extension() != nullptr,
                  "{}: parameter '{}' is {}; only floating parameters, or ones with an all-gather extension, can be "
                  "sharded", where, parameter_fqn, dtype_name(tensor.dtype()));
    // The root's lazy init refuses a parameter tied to a module outside its group's.
    for (const auto& [use_module, use_name] : tree.slots.at(parameter.get())) {
      TESSERA_CHECK(is_inside(use_module, fqn),
                    "{}: parameter '{}' is tied to '{}', which is outside {}; tied parameters must live in one group: "
                    "call fully_shard on a module that contains both",
                    where, parameter_fqn, use_name, quoted_module(fqn));
    }
    // fully_shard shards tensor-parallel pieces over a mesh of the ranks
    // holding the same piece: the plan's tp size is the pieces'.
    const auto& spec = parameter->tensor_parallel();
    TESSERA_CHECK(spec || mesh.tensor_parallel == 1,
                  "{}: the mesh {} has tp={}, but parameter '{}' is not tensor-parallel; parallelize the model on a tp "
                  "mesh of that size first (dist::DeviceMesh::planning for a plan)",
                  where, mesh.to_string(), mesh.tensor_parallel, parameter_fqn);
    TESSERA_CHECK(!spec || spec->mesh.size() == mesh.tensor_parallel,
                  "{}: parameter '{}' is a piece of {}, but the plan's mesh {} has tp={}", where, parameter_fqn,
                  spec ? spec->to_string() : std::string(), mesh.to_string(), mesh.tensor_parallel);
    claimed.emplace(parameter.get(), fqn);
    unit.params.push_back(planned_param(parameter_fqn, *parameter, tensor.sizes(), tensor.dtype()));
  }

  const MixedPrecisionPolicy& policy = call.options.mp_policy;
  // The group's own dtype, as fully_shard picks it: its floating parameters'
  // (packed bytes are unpacked by their extensions), f32 without any.
  const auto floating = std::find_if(unit.params.begin(), unit.params.end(),
                                     [](const PlannedParam& param) { return is_floating(param.dtype); });
  if (floating != unit.params.end() && !policy.param_dtype) {
    for (const PlannedParam& param : unit.params) {
      if (!is_floating(param.dtype)) continue;
      TESSERA_CHECK(param.dtype == floating->dtype,
                    "{}: parameters '{}' ({}) and '{}' ({}) differ in dtype; one group moves one dtype: set "
                    "MixedPrecisionPolicy::param_dtype or shard them in separate calls",
                    where, floating->fqn, dtype_name(floating->dtype), param.fqn, dtype_name(param.dtype));
    }
  }
  unit.param_dtype = policy.param_dtype.value_or(floating == unit.params.end() ? DType::f32 : floating->dtype);
  unit.reduce_dtype = policy.reduce_dtype.value_or(unit.param_dtype);
  unit.offloaded = call.options.offload_policy.has_value();
  TESSERA_CHECK(is_floating(unit.param_dtype) && is_floating(unit.reduce_dtype),
                "{}: param_dtype and reduce_dtype must be floating, got {} and {}", where,
                dtype_name(unit.param_dtype), dtype_name(unit.reduce_dtype));
  // FSDP's defaults: the root keeps its parameters for backward, which needs them first.
  const ReshardAfterForward reshard = call.options.reshard_after_forward.value_or(
      is_root ? ReshardAfterForward::never() : ReshardAfterForward::always());
  try {
    unit.reshard_after_forward = reshard.resolved(mesh.shard);
  } catch (const Error& error) {
    fail("{}: {}", where, error.what());
  }
  const bool tensor_parallel = std::any_of(unit.params.begin(), unit.params.end(),
                                           [](const PlannedParam& param) { return !param.tensor_parallel.empty(); });
  TESSERA_CHECK(!tensor_parallel || !unit.reshard_after_forward.group_size(),
                "{}: reshard_after_forward = {} on tensor-parallel parameters; with tensor parallelism it is true or "
                "false (as fully_shard requires)",
                where, unit.reshard_after_forward.to_string());
  lay_out(unit, mesh);
  return unit;
}

// ---- units from a live FSDP tree ------------------------------------------------------------------

// The root's state, lazily initialised so fqns and reshard settings are final.
FSDPState& initialized_root(nn::Module& root, std::string_view caller) {
  FSDPState* state = root.extension<FSDPState>();
  TESSERA_CHECK(state != nullptr, "{}: this {} is not an FSDP module; apply fully_shard to it (after its blocks) first",
                caller, root.type_name());
  if (!state->initialized()) {
    // The lazy init creates the unsharded tensors and needs real shards:
    // check first, so a meta model gets this message and no half-made context.
    for (nn::Module* module : root.modules()) {
      FSDPState* below = module->extension<FSDPState>();
      if (below == nullptr || below->group() == nullptr) continue;
      for (const auto& param : below->group()->params()) {
        TESSERA_CHECK(!param->sharded().is_meta(),
                      "{}: parameter '{}' is still on meta; call to_empty(device) and reset_parameters() first, or "
                      "plan the model's fully_shard calls with plan_fully_shard",
                      caller, param->fqn());
      }
    }
    state->lazy_init();
  }
  TESSERA_CHECK(state->is_root(), "{}: this {} ('{}') is not the FSDP root; pass the outermost FSDP module", caller,
                root.type_name(), state->fqn());
  return *state;
}

PlanMesh mesh_sizes(const dist::DeviceMesh& mesh) {
  return mesh.ndim() == 1 ? PlanMesh{.replicate = 1, .shard = mesh.size(0)}
                          : PlanMesh{.replicate = mesh.size(0), .shard = mesh.size(1)};
}

PlannedUnit unit_of_state(const FSDPState& state, const PlanMesh& mesh) {
  PlannedUnit unit;
  unit.fqn = state.fqn();
  unit.module_type = state.module().type_name();
  const FSDPParamGroup* group = state.group();
  if (group == nullptr) return unit;
  for (const auto& param : group->params()) {
    unit.params.push_back(planned_param(param->fqn(), param->param(), param->global_shape(), param->dtype()));
  }
  unit.reshard_after_forward = group->reshard_after_forward();
  unit.param_dtype = group->param_dtype();
  unit.reduce_dtype = group->reduce_dtype();
  unit.offloaded = group->offloaded();
  lay_out(unit, mesh);
  // One formula for both: the plan's layout is the group's.
  TESSERA_CHECK(unit.slot_numel == group->layout().slot_numel,
                "sharding plan: the layout of {} has {} elements a slot, its FSDP group {}", unit.label(),
                unit.slot_numel, group->layout().slot_numel);
  TESSERA_CHECK(unit.gradient_slot_numel == group->gradient_layout().slot_numel,
                "sharding plan: the gradient layout of {} has {} elements a slot, its FSDP group {}", unit.label(),
                unit.gradient_slot_numel, group->gradient_layout().slot_numel);
  return unit;
}

// ---- communication ---------------------------------------------------------------------------------

// `calls` collectives of `kind` over `ranks` ranks moving `bytes` each (the
// per-rank chunk for all-gather and reduce-scatter, the whole tensor for
// all-reduce).
void add_collective(StepCommVolume& volume, dist::CollectiveKind kind, int64_t bytes, int64_t ranks, int64_t calls) {
  const dist::CommVolume one = dist::collective_volume(kind, bytes, static_cast<int>(ranks), /*is_root=*/false);
  switch (kind) {
    case dist::CollectiveKind::all_gather:
      volume.all_gather_calls += calls;
      volume.all_gather_bytes_sent += calls * one.sent;
      volume.all_gather_bytes_received += calls * one.received;
      return;
    case dist::CollectiveKind::reduce_scatter:
      volume.reduce_scatter_calls += calls;
      volume.reduce_scatter_bytes_sent += calls * one.sent;
      volume.reduce_scatter_bytes_received += calls * one.received;
      return;
    case dist::CollectiveKind::all_reduce:
      volume.all_reduce_calls += calls;
      volume.all_reduce_bytes_sent += calls * one.sent;
      volume.all_reduce_bytes_received += calls * one.received;
      return;
    default: fail("comm_per_step: FSDP issues no {}", dist::collective_name(kind));
  }
}

// One group's collectives for a step of `micro_batches` passes, `synced` of
// them reducing their gradients.
void add_unit_comm(StepCommVolume& volume, const PlannedUnit& unit, const PlanMesh& mesh, int64_t micro_batches,
                   int64_t synced) {
  const int64_t slot_bytes = unit.all_gather_slot_bytes;
  add_collective(volume, dist::CollectiveKind::all_gather, slot_bytes, mesh.shard, micro_batches);
  // Backward's all-gather: none when kept unsharded, over the shard group
  // again, or over the post-forward group of N.
  if (unit.reshard_after_forward.is_always()) {
    add_collective(volume, dist::CollectiveKind::all_gather, slot_bytes, mesh.shard, micro_batches);
  } else if (const std::optional<int64_t> ranks = unit.reshard_after_forward.group_size()) {
    add_collective(volume, dist::CollectiveKind::all_gather, bytes_of(unit.param_dtype, unit.post_forward_slot_numel),
                   *ranks, micro_batches);
  }
  if (!unit.has_trainable_parameters()) return;
  const int64_t gradient_bytes = bytes_of(unit.reduce_dtype, unit.gradient_slot_numel + unit.gradient_flags);
  add_collective(volume, dist::CollectiveKind::reduce_scatter, gradient_bytes, mesh.shard, synced);
  if (mesh.replicate > 1) {
    add_collective(volume, dist::CollectiveKind::all_reduce, gradient_bytes, mesh.replicate, synced);
  }
  if (unit.partial_gradient_numel > 0) {
    const dist::CommVolume one = dist::collective_volume(
        dist::CollectiveKind::all_reduce, bytes_of(unit.reduce_dtype, unit.partial_gradient_numel),
        static_cast<int>(mesh.tensor_parallel), /*is_root=*/false);
    volume.partial_gradient_calls += synced;
    volume.partial_gradient_bytes_sent += synced * one.sent;
    volume.partial_gradient_bytes_received += synced * one.received;
  }
}

// ---- text ------------------------------------------------------------------------------------------

// "16384 B (16.0 KiB)": exact, so figures can be compared with stats(), and readable.
std::string bytes_text(int64_t bytes) {
  return bytes < 1024 ? dist::human_bytes(bytes) : fmt::format("{} B ({})", bytes, dist::human_bytes(bytes));
}

// As fully_shard's option reads, resolved: "true", "false" or N.
std::string reshard_text(const PlannedUnit& unit) {
  if (const std::optional<int64_t> ranks = unit.reshard_after_forward.group_size()) {
    return fmt::format("{} (backward all-gathers over {} ranks)", *ranks, *ranks);
  }
  return unit.reshard_after_forward.to_string();
}

std::string shape_text(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string holding_text(const UnshardedHolding& holding) {
  std::vector<std::string> parts;
  if (holding.all_gather_buffer > 0) {
    parts.push_back(fmt::format("all-gather buffer {}", dist::human_bytes(holding.all_gather_buffer)));
  }
  if (holding.parameters > 0) parts.push_back(fmt::format("parameters {}", dist::human_bytes(holding.parameters)));
  if (holding.post_forward_shard > 0) {
    parts.push_back(fmt::format("post-forward shard {}", dist::human_bytes(holding.post_forward_shard)));
  }
  return fmt::format("{}: {}", holding.unit, fmt::join(parts, ", "));
}

void append_unit(std::string& text, const PlannedUnit& unit, const PlanMesh& mesh) {
  if (!unit.has_group()) {
    text += fmt::format("\nmodule {}: {}, no parameters of its own\n", unit.label(), unit.module_type);
    return;
  }
  text += fmt::format("\nmodule {}: {}, {} parameters; reshard_after_forward {}; param {}, reduce {}\n",
                      unit.label(), unit.module_type, unit.params.size(), reshard_text(unit),
                      dtype_name(unit.param_dtype), dtype_name(unit.reduce_dtype));
  text += fmt::format("  all-gather buffer {} x {} = {}; unsharded parameters {}\n", mesh.shard,
                      dist::human_bytes(unit.all_gather_slot_bytes),
                      dist::human_bytes(unit.all_gather_buffer_bytes), dist::human_bytes(unit.unsharded_bytes));
  size_t name_width = std::string_view("parameter").size();
  for (const PlannedParam& param : unit.params) name_width = std::max(name_width, param.fqn.size());
  if (mesh.tensor_parallel == 1) {
    text += fmt::format("  {:<{}}  {:>16}  {:>13}  {:>12}  {:>24}\n", "parameter", name_width, "global shape",
                        "rows per rank", "padding rows", "shard bytes per rank");
    for (const PlannedParam& param : unit.params) {
      text += fmt::format("  {:<{}}  {:>16}  {:>13}  {:>12}  {:>24}\n", param.fqn, name_width,
                          shape_text(param.global_shape), param.padded_rows, param.padding_rows,
                          bytes_text(param.shard_bytes()));
    }
    return;
  }
  // Tensor parallelism: the 1-rank shape, tp rank 0's piece and FSDP's rows of it.
  size_t placement_width = std::string_view("tp placement").size();
  for (const PlannedParam& param : unit.params) placement_width = std::max(placement_width, param.tensor_parallel.size());
  text += fmt::format("  {:<{}}  {:>14}  {:<{}}  {:>14}  {:>10}  {:>8}  {:>24}\n", "parameter", name_width,
                      "logical shape", "tp placement", placement_width, "tp-local shape", "dp rows", "padding",
                      "shard bytes per rank");
  for (const PlannedParam& param : unit.params) {
    text += fmt::format("  {:<{}}  {:>14}  {:<{}}  {:>14}  {:>10}  {:>8}  {:>24}\n", param.fqn, name_width,
                        shape_text(param.logical_shape), param.tensor_parallel, placement_width,
                        shape_text(param.global_shape), param.padded_rows, param.padding_rows,
                        bytes_text(param.shard_bytes()));
  }
}

}  // namespace

// ---- PlanMesh, PlannedParam, PlannedUnit -----------------------------------------------------------

std::string PlanMesh::to_string() const {
  std::string dims = replicate == 1 ? fmt::format("shard={}", shard) : fmt::format("replicate={}, shard={}", replicate,
                                                                                  shard);
  if (tensor_parallel > 1) dims += fmt::format(", tp={}", tensor_parallel);
  return "(" + dims + ")";
}

PlanMesh plan_mesh(int64_t world, int64_t replicate, int64_t tensor_parallel) {
  TESSERA_CHECK(world >= 1 && world <= kMaxPlanRanks, "sharding plan: the world size must be in [1, {}], got {}",
                kMaxPlanRanks, world);
  TESSERA_CHECK(replicate >= 1 && world % replicate == 0,
                "sharding plan: the replicate degree {} must divide the world size {} (the HSDP mesh is replicate x "
                "world / replicate ranks)",
                replicate, world);
  TESSERA_CHECK(tensor_parallel >= 1 && (world / replicate) % tensor_parallel == 0,
                "sharding plan: the tp size {} with the replicate degree {} must divide the world size {} (the mesh is "
                "replicate x shard x tp ranks)",
                tensor_parallel, replicate, world);
  return PlanMesh{.replicate = replicate, .shard = world / (replicate * tensor_parallel),
                  .tensor_parallel = tensor_parallel};
}

void check_mesh(const PlanMesh& mesh) {
  TESSERA_CHECK(mesh.replicate >= 1 && mesh.shard >= 1 && mesh.tensor_parallel >= 1 &&
                    mesh.shard <= kMaxPlanRanks / (mesh.replicate * mesh.tensor_parallel),
                "sharding plan: mesh {} must have sizes >= 1 and at most {} ranks in all", mesh.to_string(),
                kMaxPlanRanks);
}

int64_t PlannedParam::row_numel() const {
  int64_t numel = 1;
  for (size_t dim = 1; dim < global_shape.size(); ++dim) numel *= global_shape[dim];
  return numel;
}

int64_t PlannedParam::shard_bytes() const { return bytes_of(dtype, padded_rows * row_numel()); }

bool PlannedUnit::has_trainable_parameters() const {
  return std::any_of(params.begin(), params.end(), [](const PlannedParam& param) { return param.requires_grad; });
}

// ---- plans ---------------------------------------------------------------------------------------------

ShardingPlan plan_fully_shard(const std::vector<PlannedCall>& calls, const PlanMesh& mesh) {
  TESSERA_CHECK(!calls.empty(), "plan_fully_shard: no fully_shard calls to plan");
  check_mesh(mesh);
  for (size_t index = 0; index < calls.size(); ++index) {
    TESSERA_CHECK(calls[index].module != nullptr, "plan_fully_shard: call {} has no module", index);
    TESSERA_CHECK(!calls[index].options.mesh, "plan_fully_shard: call {} ({}) sets FullyShardOptions::mesh; a plan "
                  "is made for the sizes of its PlanMesh, so leave it unset", index,
                  calls[index].module->type_name());
  }
  nn::Module& root = *calls.back().module;
  const ModuleTree tree = read_tree(root);

  std::map<const nn::Parameter*, std::string> claimed;
  std::map<size_t, PlannedUnit> units_in_order;  // by the module's pre-order index
  for (size_t index = 0; index < calls.size(); ++index) {
    const nn::Module* module = calls[index].module;
    const auto found = tree.modules.find(module);
    TESSERA_CHECK(found != tree.modules.end(), "plan_fully_shard: call {} is on a {} outside the root {} (the last "
                  "call's module, which must contain every other)", index, module->type_name(), root.type_name());
    const auto& [order, fqn] = found->second;
    TESSERA_CHECK(units_in_order.count(order) == 0, "plan_fully_shard: call {} is on {} {} again; fully_shard refuses "
                  "a module that is already an FSDP module", index, module->type_name(), quoted_module(fqn));
    const bool is_root = index + 1 == calls.size();
    units_in_order.emplace(order, unit_of_call(calls[index], fqn, is_root, mesh, tree, claimed));
  }
  std::vector<PlannedUnit> units;
  for (auto& [order, unit] : units_in_order) units.push_back(std::move(unit));
  return assemble(root.type_name(), mesh, std::move(units));
}

ShardingPlan plan_of(nn::Module& root) {
  const FSDPState& root_state = initialized_root(root, "sharding plan");
  PlanMesh mesh = mesh_sizes(root_state.mesh());
  mesh.tensor_parallel = tensor_parallel_size(root);
  std::vector<PlannedUnit> units;
  for (const FSDPState* state : root_state.tree()) {
    const PlanMesh sizes = mesh_sizes(state->mesh());
    TESSERA_CHECK(sizes.replicate == mesh.replicate && sizes.shard == mesh.shard,
                  "sharding plan: {} is sharded on mesh {}, the root on {}; a plan covers one mesh",
                  quoted_module(state->fqn()), state->mesh().to_string(), root_state.mesh().to_string());
    units.push_back(unit_of_state(*state, mesh));
  }
  return assemble(root.type_name(), mesh, std::move(units));
}

StepCommVolume comm_per_step(const ShardingPlan& plan, int64_t micro_batches, GradientSync sync) {
  TESSERA_CHECK(micro_batches >= 1, "comm_per_step: micro_batches must be >= 1, got {}", micro_batches);
  const int64_t synced = sync == GradientSync::every_micro_batch ? micro_batches : 1;
  StepCommVolume volume;
  for (const PlannedUnit& unit : plan.units) {
    if (unit.has_group()) add_unit_comm(volume, unit, plan.mesh, micro_batches, synced);
  }
  return volume;
}

std::string format_plan(const ShardingPlan& plan, const OptimizerStateSize& optimizer_state) {
  const PlanMesh& mesh = plan.mesh;
  std::string text = fmt::format("FSDP sharding plan of {} over {} rank{}, mesh {}\n", plan.model_type, mesh.world(),
                                 mesh.world() == 1 ? "" : "s", mesh.to_string());
  if (mesh.tensor_parallel > 1) {
    text += fmt::format("tensor parallelism first: each of the {} tp ranks holds a piece of every parameter (Shard) "
                        "or all of it (Replicate); the figures are tp rank 0's, whose pieces are the largest\n",
                        mesh.tensor_parallel);
  }
  text += fmt::format("every {} is split along dim 0: each rank's shard holds ceil(rows / {}) rows{}; the "
                      "last ranks' shards end in zero rows (padding)\n",
                      mesh.tensor_parallel > 1 ? "tp piece" : "parameter", mesh.shard,
                      mesh.replicate > 1 ? fmt::format(" of its shard group, and the {} replicas hold the same shards",
                                                       mesh.replicate)
                                         : std::string());
  int64_t fsdp_modules = 0;
  for (const PlannedUnit& unit : plan.units) {
    append_unit(text, unit, mesh);
    fsdp_modules += 1;
  }

  const int64_t optimizer_bytes = optimizer_state.copies * plan.gradient_bytes;
  text += "\nper rank (every rank's padded shards are the same size; rank 0 holds the most real rows, and so the "
          "largest gradients)\n";
  text += fmt::format("  parameters            {} ({:.3f} M) in {} tensors, {} FSDP modules\n", plan.parameters,
                      static_cast<double>(plan.parameters) / 1e6, plan.tensors, fsdp_modules);
  text += fmt::format("  parameter shards      {}; padding {} across the {} shard ranks\n",
                      bytes_text(plan.shard_bytes), dist::human_bytes(plan.padding_bytes), mesh.shard);
  text += fmt::format("  gradient shards       {}\n", bytes_text(plan.gradient_bytes));
  if (optimizer_state.copies > 0) {
    text += fmt::format("  {:<21} {}\n", optimizer_state.description, bytes_text(optimizer_bytes));
  }
  text += fmt::format("  unsharded peak        {} at {}{}\n", bytes_text(plan.peak.bytes),
                      plan.peak.moment.empty() ? std::string("no moment (nothing is gathered)") : plan.peak.moment,
                      plan.peak.holdings.empty() ? "" : ", holding");
  for (const UnshardedHolding& holding : plan.peak.holdings) {
    text += fmt::format("                          {}\n", holding_text(holding));
  }
  text += fmt::format("  all groups unsharded  {} (every group's parameters at once, for comparison)\n",
                      bytes_text(plan.all_groups_unsharded_bytes));
  text += fmt::format("  accumulation          {} between micro-batches (accumulating unsynced keeps every group's "
                      "unsharded gradients, in param dtype {}, none in the reduce dtype; syncing every micro-batch "
                      "keeps none)\n",
                      bytes_text(plan.accumulated_gradient_bytes), dtype_name(plan.units.empty() ? DType::f32 :
                                                                              plan.units.front().param_dtype));
  text += fmt::format("  total                 {} (shards, gradients{}, unsharded peak; activations not included)\n",
                      bytes_text(plan.shard_bytes + plan.gradient_bytes + optimizer_bytes + plan.peak.bytes),
                      optimizer_state.copies > 0 ? ", optimizer state" : "");
  if (plan.offloaded_shard_bytes > 0) {
    text += fmt::format("  on the device         {} (CPU offload: the unsharded peak{})\n",
                        bytes_text(plan.device_bytes(optimizer_state)),
                        plan.offloaded_shard_bytes == plan.shard_bytes ? "" : ", and what is not offloaded");
    text += fmt::format("  in host memory        {} (offloaded shards, gradients{}; the shards page-locked)\n",
                        bytes_text(plan.host_bytes(optimizer_state)),
                        optimizer_state.copies > 0 ? ", optimizer state" : "");
  }

  const StepCommVolume comm = comm_per_step(plan, 1);
  text += "\ncommunication per training step per rank (forward + backward, gradients synced)\n";
  text += fmt::format("  all-gather      {:3} calls, sent {}, received {}\n", comm.all_gather_calls,
                      bytes_text(comm.all_gather_bytes_sent), bytes_text(comm.all_gather_bytes_received));
  text += fmt::format("  reduce-scatter  {:3} calls, sent {}, received {}\n", comm.reduce_scatter_calls,
                      bytes_text(comm.reduce_scatter_bytes_sent), bytes_text(comm.reduce_scatter_bytes_received));
  if (comm.all_reduce_calls > 0) {
    text += fmt::format("  all-reduce      {:3} calls, sent {}, received {} (HSDP, over the replicate group)\n",
                        comm.all_reduce_calls, bytes_text(comm.all_reduce_bytes_sent),
                        bytes_text(comm.all_reduce_bytes_received));
  }
  if (comm.partial_gradient_calls > 0) {
    text += fmt::format("  all-reduce      {:3} calls, sent {}, received {} (over tp: the partial gradients' shards)\n",
                        comm.partial_gradient_calls, bytes_text(comm.partial_gradient_bytes_sent),
                        bytes_text(comm.partial_gradient_bytes_received));
  }
  text += fmt::format("  total sent      {}\n", bytes_text(comm.total_sent()));
  return text;
}

int64_t ShardingPlan::host_bytes(const OptimizerStateSize& optimizer_state) const {
  return offloaded_shard_bytes + offloaded_gradient_bytes * (1 + optimizer_state.copies);
}

int64_t ShardingPlan::device_bytes(const OptimizerStateSize& optimizer_state) const {
  return shard_bytes + gradient_bytes * (1 + optimizer_state.copies) + peak.bytes - host_bytes(optimizer_state);
}

StepCommVolume expected_comm_per_step(nn::Module& root, int64_t micro_batches, GradientSync sync) {
  return comm_per_step(plan_of(root), micro_batches, sync);
}

std::string sharding_plan(nn::Module& root, const OptimizerStateSize& optimizer_state) {
  return format_plan(plan_of(root), optimizer_state);
}

}  // namespace tessera::fsdp
