// fsdp::sharding_plan and expected_comm_per_step: read the FSDPStates of a
// model (after the root's lazy init) and add up shards and collectives with the
// same layout arithmetic FSDPParamGroup uses.
#include "fsdp/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "dist/comm_stats.h"
#include "fsdp/state.h"

namespace tessera::fsdp {

namespace {

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
                      "{}: parameter '{}' is still on meta; call to_empty(device) and reset_parameters() first",
                      caller, param->fqn());
      }
    }
    state->lazy_init();
  }
  TESSERA_CHECK(state->is_root(), "{}: this {} ('{}') is not the FSDP root; pass the outermost FSDP module", caller,
                root.type_name(), state->fqn());
  return *state;
}

int64_t bytes_of(DType dtype, int64_t numel) { return numel * static_cast<int64_t>(element_size(dtype)); }

// Elements of one rank's slot when the group's parameters are chunked over
// `world` ranks (FlatLayout::slot_numel).
int64_t slot_numel_for(const FSDPParamGroup& group, int64_t world) {
  int64_t numel = 0;
  for (const auto& param : group.params()) numel += (param->rows() + world - 1) / world * param->row_numel();
  return numel;
}

bool has_trainable_parameters(const FSDPParamGroup& group) {
  const auto& params = group.params();
  return std::any_of(params.begin(), params.end(), [](const auto& param) { return param->param().requires_grad(); });
}

// `calls` collectives of `kind` moving `bytes` each (the per-rank chunk for
// all-gather and reduce-scatter, the whole tensor for all-reduce).
void add_collective(StepCommVolume& volume, dist::CollectiveKind kind, int64_t bytes, const dist::ProcessGroup& group,
                    int64_t calls) {
  const dist::CommVolume one = dist::collective_volume(kind, bytes, group.size(), /*is_root=*/false);
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
    default: fail("expected_comm_per_step: FSDP issues no {}", dist::collective_name(kind));
  }
}

// One group's collectives for a step of `micro_batches` passes, synced once.
StepCommVolume group_comm(const FSDPParamGroup& group, int64_t micro_batches) {
  StepCommVolume volume;
  const GroupComm& comm = group.comm();
  const int64_t slot_bytes = bytes_of(group.param_dtype(), group.layout().slot_numel);
  add_collective(volume, dist::CollectiveKind::all_gather, slot_bytes, *comm.shard, micro_batches);

  // Backward's all-gather: none when kept unsharded, over the shard group
  // again, or over the post-forward group of N.
  const ReshardAfterForward& reshard = group.reshard_after_forward();
  if (reshard.is_always()) {
    add_collective(volume, dist::CollectiveKind::all_gather, slot_bytes, *comm.shard, micro_batches);
  } else if (const std::optional<int64_t> ranks = reshard.group_size()) {
    const int64_t post_forward_bytes = bytes_of(group.param_dtype(), slot_numel_for(group, *ranks));
    add_collective(volume, dist::CollectiveKind::all_gather, post_forward_bytes, *comm.post_forward, micro_batches);
  }

  if (has_trainable_parameters(group)) {
    const int64_t flags = static_cast<int64_t>(group.params().size());
    const int64_t gradient_bytes = bytes_of(group.reduce_dtype(), group.layout().slot_numel + flags);
    add_collective(volume, dist::CollectiveKind::reduce_scatter, gradient_bytes, *comm.shard, 1);
    if (comm.replicate) add_collective(volume, dist::CollectiveKind::all_reduce, gradient_bytes, *comm.replicate, 1);
  }
  return volume;
}

void accumulate(StepCommVolume& total, const StepCommVolume& part) {
  total.all_gather_calls += part.all_gather_calls;
  total.all_gather_bytes_sent += part.all_gather_bytes_sent;
  total.all_gather_bytes_received += part.all_gather_bytes_received;
  total.reduce_scatter_calls += part.reduce_scatter_calls;
  total.reduce_scatter_bytes_sent += part.reduce_scatter_bytes_sent;
  total.reduce_scatter_bytes_received += part.reduce_scatter_bytes_received;
  total.all_reduce_calls += part.all_reduce_calls;
  total.all_reduce_bytes_sent += part.all_reduce_bytes_sent;
  total.all_reduce_bytes_received += part.all_reduce_bytes_received;
}

StepCommVolume comm_of(const FSDPState& root, int64_t micro_batches) {
  TESSERA_CHECK(micro_batches >= 1, "expected_comm_per_step: micro_batches must be >= 1, got {}", micro_batches);
  StepCommVolume total;
  for (const FSDPState* state : root.tree()) {
    if (state->group() != nullptr) accumulate(total, group_comm(*state->group(), micro_batches));
  }
  return total;
}

// "16384 B (16.0 KiB)": exact, so figures can be compared with stats(), and readable.
std::string bytes_text(int64_t bytes) {
  return bytes < 1024 ? dist::human_bytes(bytes) : fmt::format("{} B ({})", bytes, dist::human_bytes(bytes));
}

// As fully_shard's option reads, resolved: "true", "false" or N.
std::string reshard_text(const FSDPParamGroup& group) {
  const ReshardAfterForward& reshard = group.reshard_after_forward();
  if (const std::optional<int64_t> ranks = reshard.group_size()) {
    return fmt::format("{} (backward all-gathers over {} ranks)", *ranks, *ranks);
  }
  return reshard.to_string();
}

std::string shape_text(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace

StepCommVolume expected_comm_per_step(nn::Module& root, int64_t micro_batches) {
  return comm_of(initialized_root(root, "expected_comm_per_step"), micro_batches);
}

std::string sharding_plan(nn::Module& root, const OptimizerStateSize& optimizer_state) {
  const FSDPState& root_state = initialized_root(root, "sharding_plan");
  const dist::DeviceMesh& mesh = root_state.mesh();
  const int rank = mesh.rank();
  std::string text = fmt::format("FSDP sharding plan of {}, seen from mesh rank {}\nmesh {}\n", root.type_name(), rank,
                                 mesh.to_string());

  int64_t shard_bytes = 0;
  int64_t unsharded_bytes = 0;
  int64_t largest_unsharded = 0;
  for (const FSDPState* state : root_state.tree()) {
    const std::string name = state->fqn().empty() ? "(root)" : state->fqn();
    const FSDPParamGroup* group = state->group();
    if (group == nullptr) {
      text += fmt::format("\nmodule {}: no parameters of its own\n", name);
      continue;
    }
    const GroupComm& comm = group->comm();
    text += fmt::format(
        "\nmodule {}: {} parameters over {} shard ranks{}; reshard_after_forward {}; param {}, reduce {}\n", name,
        group->params().size(), comm.shard->size(),
        comm.replicate ? fmt::format(" x {} replicas", comm.replicate->size()) : std::string(), reshard_text(*group),
        dtype_name(group->param_dtype()), dtype_name(group->reduce_dtype()));
    text += fmt::format("  {:<32} {:>14} {:>14} {:>12} {:>13} {:>24}\n", "parameter", "global shape", "local shape",
                        "padded rows", "padding rows", "shard bytes");
    for (const auto& param : group->params()) {
      const Tensor& shard = param->sharded();
      const int64_t bytes = bytes_of(param->dtype(), shard.numel());
      shard_bytes += bytes;
      text += fmt::format("  {:<32} {:>14} {:>14} {:>12} {:>13} {:>24}\n", param->fqn(),
                          shape_text(param->global_shape()), shape_text(shard.sizes()), param->padded_rows(),
                          param->padded_rows() - param->local_rows(), bytes_text(bytes));
    }
    unsharded_bytes += group->unsharded_bytes();
    largest_unsharded = std::max(largest_unsharded, group->unsharded_bytes());
  }

  text += fmt::format("\nper rank (rank {})\n", rank);
  text += fmt::format("  parameter shards      {}\n", bytes_text(shard_bytes));
  text += fmt::format("  gradient shards       {}\n", bytes_text(shard_bytes));
  if (optimizer_state.copies > 0) {
    text += fmt::format("  {:<21} {}\n", optimizer_state.description, bytes_text(optimizer_state.copies * shard_bytes));
  }
  text += fmt::format("  unsharded, all groups {} (largest group {}; all-gather buffers in param dtype)\n",
                      bytes_text(unsharded_bytes), bytes_text(largest_unsharded));

  const StepCommVolume comm = comm_of(root_state, 1);
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
  text += fmt::format("  total sent      {}\n", bytes_text(comm.total_sent()));
  return text;
}

}  // namespace tessera::fsdp
