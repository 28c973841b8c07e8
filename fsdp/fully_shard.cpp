// fsdp::fully_shard and the FSDPModule handle.
#include "fsdp/fully_shard.h"

#include <map>
#include <set>

#include "dist/init.h"
#include "fsdp/state.h"

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

// The option resolved against the shard group (unset stays unset).
std::optional<ReshardAfterForward> resolved(const std::optional<ReshardAfterForward>& option, int64_t shards,
                                            const std::string& module_name) {
  if (!option) return std::nullopt;
  try {
    return option->resolved(shards);
  } catch (const Error& error) {
    fail("fully_shard({}): {}", module_name, error.what());
  }
}

std::shared_ptr<FSDPState> alive(const std::weak_ptr<FSDPState>& state, std::string_view caller) {
  std::shared_ptr<FSDPState> locked = state.lock();
  TESSERA_CHECK(locked != nullptr, "{}: the module this FSDP handle was made for is gone (destroyed); a handle is "
                "valid while its module lives", caller);
  return locked;
}

// Every FSDP state in the module tree of `state` (recurse), or `state` alone.
std::vector<FSDPState*> states_in_tree(FSDPState& state, bool recurse) {
  if (!recurse) return {&state};
  std::vector<FSDPState*> states;
  for (nn::Module* below : state.module().modules()) {
    if (FSDPState* found = below->extension<FSDPState>()) states.push_back(found);
  }
  return states;
}

void add(dist::CommStats& total, const dist::CommStats& part) {
  for (size_t kind = 0; kind < total.by_kind.size(); ++kind) {
    total.by_kind[kind].calls += part.by_kind[kind].calls;
    total.by_kind[kind].bytes_sent += part.by_kind[kind].bytes_sent;
    total.by_kind[kind].bytes_received += part.by_kind[kind].bytes_received;
    total.by_kind[kind].seconds += part.by_kind[kind].seconds;
  }
}

}  // namespace

// ---- fully_shard -----------------------------------------------------------------------------------

namespace {

// The tp group of the tensor-parallel parameters among `params` (null when
// there are none). One module's pieces come from one tp mesh, and FSDP's mesh
// must not contain it: FSDP shards within a tp rank's pieces.
dist::ProcessGroupPtr tensor_parallel_group_of(const std::vector<nn::NamedParameter>& params,
                                               const std::string& name) {
  dist::ProcessGroupPtr group;
  std::string first;
  for (const auto& [fqn, parameter] : params) {
    const auto& spec = parameter->tensor_parallel();
    if (!spec) continue;
    if (!group) {
      group = spec->mesh.group(0);
      first = fqn;
    }
    TESSERA_CHECK(spec->mesh.group(0) == group,
                  "fully_shard({}): parameters '{}' and '{}' are tensor-parallel over different tp meshes", name,
                  first, fqn);
  }
  return group;
}

}  // namespace

FSDPModule fully_shard(nn::Module& module, FullyShardOptions options) {
  const std::string name = module.type_name();
  TESSERA_CHECK(module.extension<FSDPState>() == nullptr, "fully_shard: this {} is already an FSDP module", name);
  const dist::DeviceMesh mesh = options.mesh ? *options.mesh : default_mesh();
  TESSERA_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2,
                "fully_shard({}): the mesh must be 1-D (shard) or 2-D (replicate, shard), got {}", name,
                mesh.to_string());

  // Every check comes before the first parameter is sharded: a failed call
  // leaves the module as it was.
  TESSERA_CHECK(!options.offload_policy || mesh.device().is_cuda(),
                "fully_shard({}): CPUOffloadPolicy needs a mesh on the cuda device that computes, got {}; on the cpu "
                "the shards are in host memory already (leave offload_policy unset)", name, mesh.to_string());
  const dist::ProcessGroupPtr& shard_group = mesh.group(mesh.ndim() - 1);
  const std::optional<ReshardAfterForward> reshard_after_forward =
      resolved(options.reshard_after_forward, shard_group->size(), name);

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
    // Packed bytes (NF4's) shard too, with an all-gather extension to unpack
    // them: without one they would be cast to param_dtype.
    TESSERA_CHECK(is_floating(parameter->tensor().dtype()) || parameter->all_gather_extension() != nullptr,
                  "fully_shard({}): parameter '{}' is {}; only floating parameters, or ones with an all-gather "
                  "extension (nn/all_gather_extension.h), can be sharded", name, fqn,
                  dtype_name(parameter->tensor().dtype()));
    to_shard.emplace_back(fqn, parameter);
  }
  // Tensor parallelism underneath: FSDP shards each rank's piece over its
  // own (data-parallel) mesh, so the global layout is "tp first, dp inside";
  // the partial gradients of sequence-parallel parameters are summed over
  // tp after the reduce-scatter (their Parameters stop summing them).
  const dist::ProcessGroupPtr tensor_parallel_group = tensor_parallel_group_of(to_shard, name);
  if (tensor_parallel_group) {
    for (int64_t dim = 0; dim < mesh.ndim(); ++dim) {
      int64_t shared = 0;
      for (int rank : mesh.group(dim)->world_ranks()) {
        for (int tp_rank : tensor_parallel_group->world_ranks()) shared += rank == tp_rank ? 1 : 0;
      }
      TESSERA_CHECK(shared == 1,
                    "fully_shard({}): the mesh {} shares ranks with the tensor-parallel group along dim {}: shard over "
                    "the data-parallel mesh (mesh[\"dp\"]), whose ranks hold the same tp piece",
                    name, mesh.to_string(), dim);
    }
  }
  TESSERA_CHECK(!tensor_parallel_group || !reshard_after_forward || !reshard_after_forward->group_size(),
                "fully_shard({}): reshard_after_forward = {} on tensor-parallel parameters; with tensor parallelism "
                "it is true or false (as in PyTorch)",
                name, reshard_after_forward ? reshard_after_forward->to_string() : "");
  for (auto& [fqn, parameter] : to_shard) {
    if (parameter->sums_partial_gradient()) parameter->set_sums_partial_gradient(false);
  }
  const nn::ShardMemory memory = !options.offload_policy           ? nn::ShardMemory::device
                                 : options.offload_policy->pin_memory ? nn::ShardMemory::pinned_host
                                                                      : nn::ShardMemory::host;
  std::vector<std::unique_ptr<FSDPParam>> params;
  for (auto& [fqn, parameter] : to_shard) params.push_back(std::make_unique<FSDPParam>(fqn, parameter, mesh, memory));

  std::unique_ptr<FSDPParamGroup> group;
  if (!params.empty()) {
    GroupComm comm{.shard = shard_group,
                   .replicate = mesh.ndim() == 2 ? mesh.group(0) : nullptr,
                   .post_forward = nullptr,
                   .tensor_parallel = tensor_parallel_group};
    const std::optional<int64_t> post_forward_ranks =
        reshard_after_forward ? reshard_after_forward->group_size() : std::nullopt;
    if (post_forward_ranks) comm.post_forward = post_forward_group(shard_group, *post_forward_ranks);
    // The root's default (never) is set at its lazy init, once it is known.
    group = std::make_unique<FSDPParamGroup>(
        std::move(params), std::move(comm), options.mp_policy,
        reshard_after_forward.value_or(ReshardAfterForward::always()), "",
        options.offload_policy ? std::optional<Device>(mesh.device()) : std::nullopt);
  }
  auto state = std::make_shared<FSDPState>(module, std::move(group), mesh, options.mp_policy, reshard_after_forward);
  std::weak_ptr<FSDPState> handle = state;
  module.add_extension(std::move(state));
  return FSDPModule(std::move(handle));
}

std::optional<FSDPModule> fsdp_module(nn::Module& module) {
  FSDPState* state = module.extension<FSDPState>();
  if (state == nullptr) return std::nullopt;
  return FSDPModule(state->weak_from_this());
}

// ---- UnshardHandle ---------------------------------------------------------------------------------

void UnshardHandle::wait() {
  if (all_gather_ == 0) return;
  const std::shared_ptr<FSDPState> state = alive(state_, "UnshardHandle::wait");
  FSDPParamGroup* group = state->group();
  if (group->pending_all_gather() == all_gather_) group->wait_for_unshard();
}

// ---- FSDPModule ------------------------------------------------------------------------------------

nn::Module& FSDPModule::module() const { return alive(state_, "FSDPModule::module")->module(); }

UnshardHandle FSDPModule::unshard(bool async_op) {
  // No lazy init here: only the root's first forward knows the whole tree
  // (the group says so if this comes first).
  const std::shared_ptr<FSDPState> state = alive(state_, "FSDPModule::unshard");
  FSDPParamGroup* group = state->group();
  if (group == nullptr) return UnshardHandle();
  group->unshard(async_op);
  const std::optional<int64_t> pending = group->pending_all_gather();
  return pending ? UnshardHandle(state_, *pending) : UnshardHandle();
}

void FSDPModule::reshard() {
  const std::shared_ptr<FSDPState> state = alive(state_, "FSDPModule::reshard");
  if (FSDPParamGroup* group = state->group()) group->reshard(ShardState::sharded);
}

void FSDPModule::set_requires_gradient_sync(bool requires_gradient_sync, bool recurse) {
  const std::shared_ptr<FSDPState> state = alive(state_, "FSDPModule::set_requires_gradient_sync");
  for (FSDPState* below : states_in_tree(*state, recurse)) {
    if (below->group() != nullptr) below->group()->set_requires_gradient_sync(requires_gradient_sync);
  }
}

void FSDPModule::set_reshard_after_backward(bool reshard_after_backward, bool recurse) {
  const std::shared_ptr<FSDPState> state = alive(state_, "FSDPModule::set_reshard_after_backward");
  for (FSDPState* below : states_in_tree(*state, recurse)) {
    if (below->group() != nullptr) below->group()->set_reshard_after_backward(reshard_after_backward);
  }
}

void FSDPModule::set_is_last_backward(bool is_last_backward) {
  const std::shared_ptr<FSDPState> state = alive(state_, "FSDPModule::set_is_last_backward");
  // Only the root's final callback reads it; before the first forward the
  // root is not known yet, and lazy init refuses a non-root that was set.
  TESSERA_CHECK(!state->initialized() || state->is_root(), "FSDPModule::set_is_last_backward: '{}' ({}) is not the "
                "FSDP root; the root's backward decides, so call it on the root", state->fqn(),
                state->module().type_name());
  state->set_is_last_backward(is_last_backward);
}

std::vector<FSDPState*> FSDPModule::live_states(const std::vector<FSDPModule>& modules, const char* caller) {
  std::vector<FSDPState*> states;
  for (const FSDPModule& module : modules) states.push_back(alive(module.state_, caller).get());
  return states;
}

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  const char* caller = "FSDPModule::set_modules_to_forward_prefetch";
  alive(state_, caller)->set_forward_prefetch(live_states(modules, caller));
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  const char* caller = "FSDPModule::set_modules_to_backward_prefetch";
  alive(state_, caller)->set_backward_prefetch(live_states(modules, caller));
}

dist::CommStats FSDPModule::communication_stats(bool recurse) const {
  const std::shared_ptr<FSDPState> state = alive(state_, "FSDPModule::communication_stats");
  dist::CommStats total;
  for (const FSDPState* below : states_in_tree(*state, recurse)) {
    if (below->group() != nullptr) add(total, below->group()->comm_stats());
  }
  return total;
}

dist::CommStats FSDPModule::tensor_parallel_communication_stats(bool recurse) const {
  const std::shared_ptr<FSDPState> state = alive(state_, "FSDPModule::tensor_parallel_communication_stats");
  dist::CommStats total;
  for (const FSDPState* below : states_in_tree(*state, recurse)) {
    if (below->group() != nullptr) add(total, below->group()->tensor_parallel_comm_stats());
  }
  return total;
}

void FSDPModule::reset_communication_stats(bool recurse) {
  const std::shared_ptr<FSDPState> state = alive(state_, "FSDPModule::reset_communication_stats");
  for (FSDPState* below : states_in_tree(*state, recurse)) {
    if (below->group() != nullptr) below->group()->reset_comm_stats();
  }
}

MemoryStats FSDPModule::unsharded_memory(bool recurse) const {
  return alive(state_, "FSDPModule::unsharded_memory")->unsharded_memory(recurse);
}

void FSDPModule::reset_unsharded_memory_peak(bool recurse) {
  alive(state_, "FSDPModule::reset_unsharded_memory_peak")->reset_unsharded_memory_peak(recurse);
}

}  // namespace tessera::fsdp
