// fsdp::fully_shard and the FSDPModule handle.
#include "fsdp/fully_shard.h"

#include <algorithm>

#include <map>
#include <set>

#include "dist/launch.h"

namespace tessera::fsdp {

namespace {

// One default 1-D mesh per world group, shared by every fully_shard call of
// the rank (building a mesh is a collective).
const dist::DeviceMesh& default_mesh() {
  thread_local std::weak_ptr<dist::ProcessGroup> cached_world;
  thread_local dist::DeviceMesh cached_mesh;
  const dist::ProcessGroupPtr& world = dist::world();
  TESSERA_CHECK(world != nullptr, "fully_shard: no mesh was given and there is no distributed world on this thread; "
                "run inside dist::init or dist::run_local, or pass FullyShardOptions::mesh");
  if (cached_world.lock() != world) {
    cached_mesh = dist::DeviceMesh(world, kCPU, {world->size()}, {"shard"});
    cached_world = world;
  }
  return cached_mesh;
}

// The sub-groups of N consecutive ranks of `shard` that reshard_after_forward
// = N gathers over in backward; one split per (group, N), shared.
dist::ProcessGroupPtr post_forward_group(const dist::ProcessGroupPtr& shard, int64_t shards) {
  thread_local std::map<std::pair<const dist::ProcessGroup*, int64_t>,
                        std::pair<std::weak_ptr<dist::ProcessGroup>, dist::ProcessGroupPtr>>
      cache;
  const auto key = std::make_pair(shard.get(), shards);
  if (auto found = cache.find(key); found != cache.end() && found->second.first.lock() == shard) {
    return found->second.second;
  }
  const int first = static_cast<int>(shard->rank() / shards * shards);
  std::vector<int> members;
  for (int rank = first; rank < first + shards; ++rank) members.push_back(rank);
  auto group = shard->split(members, fmt::format("{}:reshard{}", shard->name(), shards));
  cache[key] = {shard, group};
  return group;
}

// The resolved reshard_after_forward as a shard count (unset stays unset).
std::optional<int64_t> post_forward_shards(const std::optional<ReshardAfterForward>& option, int64_t shards,
                                           const std::string& module_name) {
  if (!option) return std::nullopt;
  if (const bool* flag = std::get_if<bool>(&*option)) return *flag ? shards : 1;
  const int64_t count = std::get<int64_t>(*option);
  TESSERA_CHECK(count >= 1 && count <= shards && shards % count == 0,
                "fully_shard({}): reshard_after_forward = {} must divide the shard group size {} (1 = false, {} = true)",
                module_name, count, shards, shards);
  return count;
}

}  // namespace

// ---- fully_shard -----------------------------------------------------------------------------------

FSDPModule fully_shard(nn::Module& module, FullyShardOptions options) {
  const std::string name = module.type_name();
  TESSERA_CHECK(module.extension<FSDPState>() == nullptr, "fully_shard: this {} is already an FSDP module", name);
  const dist::DeviceMesh mesh = options.mesh ? *options.mesh : default_mesh();
  TESSERA_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2,
                "fully_shard({}): the mesh must be 1-D (shard) or 2-D (replicate, shard), got {}", name,
                mesh.to_string());

  // Every check comes before the first parameter is sharded: a failed call
  // leaves the module as it was.
  const dist::ProcessGroupPtr& shard_group = mesh.group(mesh.ndim() - 1);
  const std::optional<int64_t> shards = post_forward_shards(options.reshard_after_forward, shard_group->size(), name);

  // What calls below this one already manage.
  std::set<const nn::Parameter*> managed;
  for (nn::Module* below : module.modules()) {
    FSDPState* state = below->extension<FSDPState>();
    if (state == nullptr) continue;
    TESSERA_CHECK(!state->initialized(), "fully_shard({}): a module below it has already run forward; apply "
                  "fully_shard to every module before the first forward", name);
    if (state->group() == nullptr) continue;
    for (const auto& param : state->group()->params()) managed.insert(&param->param());
  }
  std::set<const nn::Parameter*> ignored;
  for (const auto& param : options.ignored_params) ignored.insert(param.get());

  std::vector<nn::NamedParameter> to_shard;
  for (auto& [fqn, parameter] : module.named_parameters()) {
    if (managed.count(parameter.get()) > 0 || ignored.count(parameter.get()) > 0) continue;
    TESSERA_CHECK(managing_state(*parameter) == nullptr && !parameter->is_sharded(),
                  "fully_shard({}): parameter '{}' has already been sharded by fully_shard on an enclosing or other "
                  "module; apply fully_shard bottom-up (blocks first, then the root), and keep tied parameters in one "
                  "module's call", name, fqn);
    TESSERA_CHECK(parameter->tensor().dim() >= 1, "fully_shard({}): parameter '{}' is 0-d; dim-0 sharding needs dim "
                  ">= 1 (pass it in ignored_params to keep it whole)", name, fqn);
    TESSERA_CHECK(is_floating(parameter->tensor().dtype()), "fully_shard({}): parameter '{}' is {}; only floating "
                  "parameters can be sharded", name, fqn, dtype_name(parameter->tensor().dtype()));
    to_shard.emplace_back(fqn, parameter);
  }
  std::vector<std::unique_ptr<FSDPParam>> params;
  for (auto& [fqn, parameter] : to_shard) params.push_back(std::make_unique<FSDPParam>(fqn, parameter, mesh));

  std::unique_ptr<FSDPParamGroup> group;
  if (!params.empty()) {
    GroupComm comm{.shard = shard_group, .replicate = mesh.ndim() == 2 ? mesh.group(0) : nullptr,
                   .post_forward = nullptr};
    if (shards && *shards > 1 && *shards < shard_group->size()) comm.post_forward = post_forward_group(shard_group, *shards);
    group = std::make_unique<FSDPParamGroup>(std::move(params), std::move(comm), options.mp_policy,
                                             shards.value_or(shard_group->size()), "");
  }
  auto state = std::make_shared<FSDPState>(module, std::move(group), mesh, options.mp_policy, shards);
  FSDPState& handle = *state;
  module.add_extension(std::move(state));
  return FSDPModule(handle);
}

std::optional<FSDPModule> fsdp_module(nn::Module& module) {
  FSDPState* state = module.extension<FSDPState>();
  if (state == nullptr) return std::nullopt;
  return FSDPModule(*state);
}

// ---- FSDPModule ------------------------------------------------------------------------------------

void UnshardHandle::wait() {
  if (group_ != nullptr) group_->wait_for_unshard();
}

UnshardHandle FSDPModule::unshard(bool async_op) {
  // No lazy init here: only the root's first forward knows the whole tree
  // (the group says so if this comes first).
  FSDPParamGroup* group = state_->group();
  if (group == nullptr) return UnshardHandle();
  group->unshard(async_op);
  return UnshardHandle(group);
}

void FSDPModule::reshard() {
  if (FSDPParamGroup* group = state_->group()) group->reshard(false);
}

std::vector<FSDPState*> FSDPModule::states_in_tree(bool recurse) const {
  if (!recurse) return {state_};
  std::vector<FSDPState*> states;
  for (nn::Module* below : state_->module().modules()) {
    if (FSDPState* state = below->extension<FSDPState>()) states.push_back(state);
  }
  return states;
}

void FSDPModule::set_requires_gradient_sync(bool requires_gradient_sync, bool recurse) {
  for (FSDPState* state : states_in_tree(recurse)) {
    if (state->group() != nullptr) state->group()->requires_gradient_sync = requires_gradient_sync;
  }
}

void FSDPModule::set_reshard_after_backward(bool reshard_after_backward, bool recurse) {
  for (FSDPState* state : states_in_tree(recurse)) {
    if (state->group() != nullptr) state->group()->reshard_after_backward = reshard_after_backward;
  }
}

std::vector<dist::ProcessGroupPtr> FSDPModule::communication_groups(bool recurse) const {
  std::vector<dist::ProcessGroupPtr> groups;
  for (const FSDPState* state : states_in_tree(recurse)) {
    if (state->group() == nullptr) continue;
    const GroupComm& comm = state->group()->comm();
    for (const dist::ProcessGroupPtr& group : {comm.shard, comm.replicate, comm.post_forward}) {
      if (group != nullptr && std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
    }
  }
  return groups;
}

void FSDPModule::set_is_last_backward(bool is_last_backward) { state_->is_last_backward = is_last_backward; }

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  std::vector<FSDPState*> states;
  for (const FSDPModule& module : modules) states.push_back(module.state_);
  state_->forward_prefetch = std::move(states);
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  std::vector<FSDPState*> states;
  for (const FSDPModule& module : modules) states.push_back(module.state_);
  state_->backward_prefetch = std::move(states);
}

}  // namespace tessera::fsdp
