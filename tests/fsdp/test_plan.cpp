// fsdp::ShardingPlan held to formulas written out here from the parameters'
// shapes (per-rank shards of ceil(rows / S) rows, padding, the bytes each
// collective of a step moves for FSDP and HSDP, the unsharded peak of two
// consecutive groups), for odd, even and 1,024-rank worlds; and, for small
// worlds, to what fully_shard on run_local ranks really allocates and sends.
// Bad worlds, meshes and call lists give a clear tessera::Error.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <sstream>

#include "autograd/functions.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "fsdp/plan.h"
#include "nn/linear.h"
#include "nn/models/gpt.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tests/fsdp/layer_stack.h"
#include "tests/fsdp/plan_text.h"
#include "tests/fsdp/sharded_gpt.h"
#include "tests/fsdp/training_harness.h"

using namespace tessera;
using namespace tessera::fsdp;
using namespace tessera::fsdp::testing;

namespace {

// ---- the reference formulas, from shapes alone ----------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t elements_per_row(const Shape& shape) {
  int64_t numel = 1;
  for (size_t d = 1; d < shape.size(); ++d) numel *= shape[d];
  return numel;
}

// Elements of one rank's slot over `world` ranks: every parameter's ceil(rows / world) rows.
int64_t slot_of(const std::vector<std::shared_ptr<nn::Parameter>>& params, int64_t world) {
  int64_t numel = 0;
  for (const auto& param : params) {
    numel += ceil_div(param->global_shape()[0], world) * elements_per_row(param->global_shape());
  }
  return numel;
}

int64_t numel_of(const std::vector<std::shared_ptr<nn::Parameter>>& params) {
  int64_t numel = 0;
  for (const auto& param : params) numel += shape_numel(param->global_shape());
  return numel;
}

// A GPT's own parameters, those outside its blocks: the root's group.
std::vector<std::shared_ptr<nn::Parameter>> root_parameters(nn::GPT& model) {
  std::set<const nn::Parameter*> in_blocks;
  for (const auto& block : model.blocks()) {
    for (const auto& param : block->parameters()) in_blocks.insert(param.get());
  }
  std::vector<std::shared_ptr<nn::Parameter>> own;
  for (const auto& param : model.parameters()) {
    if (in_blocks.count(param.get()) == 0) own.push_back(param);
  }
  return own;
}

// The calls build_sharded_gpt makes: every block, then the root.
std::vector<PlannedCall> gpt_calls(nn::GPT& model, const FullyShardOptions& block_options = {}) {
  std::vector<PlannedCall> calls;
  for (const auto& block : model.blocks()) calls.push_back({.module = block.get(), .options = block_options});
  FullyShardOptions root_options;
  root_options.mp_policy = block_options.mp_policy;
  calls.push_back({.module = &model, .options = root_options});
  return calls;
}

std::vector<PlannedCall> chain_calls(LayerStack& chain) {
  std::vector<PlannedCall> calls;
  for (const auto& layer : chain.layers()) calls.push_back({.module = layer.get(), .options = {}});
  calls.push_back({.module = &chain, .options = {}});
  return calls;
}

const std::vector<PlanMesh> kMeshes = {plan_mesh(1),    plan_mesh(2),    plan_mesh(3),      plan_mesh(5),
                                       plan_mesh(8),    plan_mesh(1024), plan_mesh(6, 2),   plan_mesh(1024, 4),
                                       plan_mesh(9, 3), plan_mesh(2, 2)};

}  // namespace

TEST_CASE("plan: every rank's shards are ceil(rows / S) rows of each parameter; padding and gradients follow") {
  nn::GPT model(kAwkward, kMeta);  // vocab 97, 3 heads of 24: rows 97, 8, 72, 216, 288
  for (const PlanMesh& mesh : kMeshes) {
    CAPTURE(mesh.to_string());
    const ShardingPlan plan = plan_fully_shard(gpt_calls(model), mesh);
    const int64_t S = mesh.shard;
    int64_t shards = 0, padding = 0, gradients = 0, tensors = 0;
    for (const auto& [name, param] : model.named_parameters()) {
      const int64_t rows = param->global_shape()[0], row = elements_per_row(param->global_shape());
      shards += ceil_div(rows, S) * row * 4;
      padding += (ceil_div(rows, S) * S - rows) * row * 4;
      gradients += std::min(ceil_div(rows, S), rows) * row * 4;
      tensors += 1;
    }
    CHECK(plan.mesh == mesh);
    CHECK(plan.parameters == kAwkward.num_parameters());
    CHECK(plan.tensors == tensors);
    CHECK(plan.shard_bytes == shards);
    CHECK(plan.padding_bytes == padding);
    CHECK(plan.gradient_bytes == gradients);
    // Per parameter, in the table's order: blocks' units after the root's.
    REQUIRE(plan.units.size() == static_cast<size_t>(kAwkward.n_layer) + 1);
    CHECK(plan.units.front().label() == "(root)");
    CHECK(plan.units.back().fqn == "blocks.2");
    for (const PlannedUnit& unit : plan.units) {
      for (const PlannedParam& param : unit.params) {
        CAPTURE(param.fqn);
        CHECK(param.padded_rows == ceil_div(param.rows(), S));
        CHECK(param.padding_rows == ceil_div(param.rows(), S) * S - param.rows());
      }
    }
  }
  // 1024 ranks: wte's 97 rows are one row on each of the first 97 ranks and
  // a zero row on the other 927, as the table says.
  const ShardingPlan wide = plan_fully_shard(gpt_calls(model), plan_mesh(1024));
  const PlannedParam& wte = wide.units.front().params.front();
  CHECK(wte.fqn == "wte.weight");
  CHECK(wte.padded_rows == 1);
  CHECK(wte.padding_rows == 927);
  const std::string text = format_plan(wide);
  CHECK(text.find("FSDP sharding plan of GPT over 1024 ranks, mesh (shard=1024)") != std::string::npos);
  CHECK(table_row(text, "wte.weight") == "wte.weight [97, 72] 1 927 288 B");
}

TEST_CASE("plan: a step's bytes are (S - 1) slots per all-gather and reduce-scatter, 2(R - 1)/R per all-reduce") {
  struct Case {
    const char* name;
    PlanMesh mesh;
    FullyShardOptions blocks;
    int64_t micro_batches;
    GradientSync sync = GradientSync::last_micro_batch;
  };
  const std::vector<Case> cases = {
      {"3 ranks", plan_mesh(3), {}, 1},
      {"4 ranks, 2 micro-batches", plan_mesh(4), {}, 2},
      {"4 ranks, 3 micro-batches, each synced", plan_mesh(4), {}, 3, GradientSync::every_micro_batch},
      {"HSDP 2 x 2, 2 micro-batches, each synced", plan_mesh(4, 2), {}, 2, GradientSync::every_micro_batch},
      {"1024 ranks", plan_mesh(1024), {}, 1},
      {"HSDP 2 x 3, bf16 parameters, f32 gradients", plan_mesh(6, 2),
       {.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32}}, 1},
      {"HSDP 4 x 256", plan_mesh(1024, 4), {}, 1},
      {"4 ranks, reshard_after_forward 2", plan_mesh(4), {.reshard_after_forward = ReshardAfterForward::to_group_of(2)},
       1},
      {"5 ranks, reshard_after_forward false", plan_mesh(5), {.reshard_after_forward = false}, 1},
  };
  nn::GPT model(kAwkward, kMeta);
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const int64_t S = c.mesh.shard, R = c.mesh.replicate, M = c.micro_batches;
    const int64_t param_bytes = c.blocks.mp_policy.param_dtype == DType::bf16 ? 2 : 4;
    const int64_t reduce_bytes = 4;
    const int64_t synced = c.sync == GradientSync::every_micro_batch ? M : 1;
    const StepCommVolume comm = comm_per_step(plan_fully_shard(gpt_calls(model, c.blocks), c.mesh), M, c.sync);

    StepCommVolume expected;
    const auto add_group = [&](const std::vector<std::shared_ptr<nn::Parameter>>& params, bool backward_gather) {
      const int64_t slot = slot_of(params, S);
      const int64_t gradient_slot = (slot + static_cast<int64_t>(params.size())) * reduce_bytes;  // + presence flags
      expected.all_gather_calls += M * (backward_gather ? 2 : 1);
      expected.all_gather_bytes_sent += M * (S - 1) * slot * param_bytes;  // forward
      if (backward_gather) {
        const std::optional<int64_t> N = c.blocks.reshard_after_forward ? c.blocks.reshard_after_forward->group_size()
                                                                        : std::nullopt;
        expected.all_gather_bytes_sent += N ? M * (*N - 1) * slot_of(params, *N) * param_bytes
                                            : M * (S - 1) * slot * param_bytes;
      }
      expected.reduce_scatter_calls += synced;
      expected.reduce_scatter_bytes_sent += synced * (S - 1) * gradient_slot;
      if (R > 1) {
        expected.all_reduce_calls += synced;
        expected.all_reduce_bytes_sent += synced * 2 * (R - 1) * gradient_slot / R;
      }
    };
    // The root is kept unsharded after forward; the blocks gather again in backward
    // unless they keep their parameters (false) or run alone (S = 1).
    add_group(root_parameters(model), false);
    const bool keep = c.blocks.reshard_after_forward && c.blocks.reshard_after_forward->is_never();
    const bool blocks_regather = S > 1 && !keep;
    for (const auto& block : model.blocks()) add_group(block->parameters(), blocks_regather);

    CHECK(comm.all_gather_calls == expected.all_gather_calls);
    CHECK(comm.all_gather_bytes_sent == expected.all_gather_bytes_sent);
    CHECK(comm.all_gather_bytes_received == expected.all_gather_bytes_sent);
    CHECK(comm.reduce_scatter_calls == expected.reduce_scatter_calls);
    CHECK(comm.reduce_scatter_bytes_sent == expected.reduce_scatter_bytes_sent);
    CHECK(comm.all_reduce_calls == expected.all_reduce_calls);
    CHECK(comm.all_reduce_bytes_sent == expected.all_reduce_bytes_sent);
    CHECK(comm.total_sent() == expected.total_sent());
  }
}

TEST_CASE("plan: the unsharded peak is two consecutive groups (current + prefetched) and says which") {
  // Layers of different sizes: a group's all-gather buffer B_k (S padded
  // slots) and its unsharded parameters P_k. Forward holds B_k + P_k in its
  // copy-out, then P_k + B_{k+1} once it prefetches; backward the same with
  // B_{k-1}. The peak is the largest of those.
  const std::vector<int64_t> widths{24, 96, 40, 120, 32, 64};
  LayerStack chain(widths);
  for (const PlanMesh& mesh : {plan_mesh(2), plan_mesh(3), plan_mesh(7), plan_mesh(1024), plan_mesh(8, 2)}) {
    CAPTURE(mesh.to_string());
    const ShardingPlan plan = plan_fully_shard(chain_calls(chain), mesh);
    std::vector<int64_t> buffer, parameters;
    for (const auto& layer : chain.layers()) {
      buffer.push_back(mesh.shard * slot_of(layer->parameters(), mesh.shard) * 4);
      parameters.push_back(numel_of(layer->parameters()) * 4);
    }
    int64_t peak = 0;
    size_t peak_layer = 0;
    for (size_t k = 0; k < buffer.size(); ++k) {
      int64_t here = buffer[k] + parameters[k];
      if (k + 1 < buffer.size()) here = std::max(here, parameters[k] + buffer[k + 1]);
      if (k > 0) here = std::max(here, parameters[k] + buffer[k - 1]);
      if (here > peak) std::tie(peak, peak_layer) = std::make_pair(here, k);
    }
    CHECK(plan.peak.bytes == peak);
    // The moment names the running layer, and it holds memory then.
    CHECK(plan.peak.moment.find(fmt::format("layers.{}", peak_layer)) != std::string::npos);
    const bool named = std::any_of(plan.peak.holdings.begin(), plan.peak.holdings.end(), [&](const auto& holding) {
      return holding.unit == fmt::format("layers.{}", peak_layer) && holding.parameters == parameters[peak_layer];
    });
    CHECK(named);
    int64_t held = 0;
    for (const UnshardedHolding& holding : plan.peak.holdings) held += holding.total();
    CHECK(held == plan.peak.bytes);
    int64_t all = 0;
    for (int64_t bytes : parameters) all += bytes;
    CHECK(plan.all_groups_unsharded_bytes == all);
  }

  // A GPT: the root's parameters stay unsharded from its forward to the end
  // of backward, so the peak is the root's copy-out (its buffer and
  // parameters) or the root's parameters with a block's copy-out.
  nn::GPT model(kAwkward, kMeta);
  for (const PlanMesh& mesh : {plan_mesh(2), plan_mesh(5), plan_mesh(1024), plan_mesh(12, 3)}) {
    CAPTURE(mesh.to_string());
    const int64_t S = mesh.shard;
    const int64_t root_params = numel_of(root_parameters(model)) * 4;
    const int64_t root_buffer = S * slot_of(root_parameters(model), S) * 4;
    const int64_t block_params = numel_of(model.block(0).parameters()) * 4;
    const int64_t block_buffer = S * slot_of(model.block(0).parameters(), S) * 4;
    const int64_t L = kAwkward.n_layer;

    const ShardingPlan resharding = plan_fully_shard(gpt_calls(model), mesh);
    CHECK(resharding.peak.bytes == std::max(root_buffer + root_params, root_params + block_buffer + block_params));
    // false: every block stays unsharded until its backward; the last one's copy-out is the peak.
    const ShardingPlan keeping = plan_fully_shard(gpt_calls(model, {.reshard_after_forward = false}), mesh);
    CHECK(keeping.peak.bytes ==
          std::max(root_buffer + root_params, root_params + L * block_params + block_buffer));
    CHECK(keeping.peak.moment == "the copy-out of blocks.2 in forward");
  }
  // Which groups make it, in the plan's words: here the root's parameters
  // and the first block's copy-out.
  const ShardingPlan small = plan_fully_shard(gpt_calls(model), plan_mesh(1024));
  CHECK(small.peak.moment == "the copy-out of blocks.0 in forward");
  REQUIRE(small.peak.holdings.size() == 2);
  CHECK(small.peak.holdings[0].unit == "(root)");
  CHECK(small.peak.holdings[0].parameters == numel_of(root_parameters(model)) * 4);
  CHECK(small.peak.holdings[0].all_gather_buffer == 0);
  CHECK(small.peak.holdings[1].unit == "blocks.0");
  CHECK(small.peak.holdings[1].all_gather_buffer == 1024 * slot_of(model.block(0).parameters(), 1024) * 4);
  const std::string text = format_plan(small);
  CHECK(text.find("  unsharded peak        " + std::to_string(small.peak.bytes) +
                  " B (2.3 MiB) at the copy-out of blocks.0 in forward, holding\n"
                  "                          (root): parameters 30.1 KiB\n"
                  "                          blocks.0: all-gather buffer 2.0 MiB, parameters 246.7 KiB\n") !=
        std::string::npos);
  // GPT-2 XL over 1,024 ranks: the root's copy-out makes it (its 50257-row
  // embedding gathered into 1024 slots of 50 rows), not two blocks.
  nn::GPT xl(nn::GPTConfig::preset("gpt2-1558m"), kMeta);
  const ShardingPlan wide = plan_fully_shard(gpt_calls(xl), plan_mesh(1024));
  CHECK(wide.peak.moment == "the copy-out of (root) in forward");
  REQUIRE(wide.peak.holdings.size() == 1);
  CHECK(wide.peak.holdings.front().unit == "(root)");
  CHECK(wide.peak.bytes == numel_of(root_parameters(xl)) * 4 + 1024 * slot_of(root_parameters(xl), 1024) * 4);
}

TEST_CASE("plan: for small worlds it is what fully_shard on run_local ranks allocates and sends") {
  struct Case {
    const char* name;
    int world, replicate;
    FullyShardOptions blocks;
    bool frozen = false;  // attention's qkv and the position embedding frozen: no gradient slot, no gradient
    bool qlora = false;   // every parameter frozen, the blocks' projections NF4 with rank-2 adapters
  };
  const std::vector<Case> cases = {
      {"1 rank", 1, 1, {}},
      {"2 ranks", 2, 1, {}},
      {"3 ranks (uneven: vocab 97)", 3, 1, {}},
      {"3 ranks, reshard_after_forward false", 3, 1, {.reshard_after_forward = false}},
      {"4 ranks, reshard_after_forward 2", 4, 1, {.reshard_after_forward = ReshardAfterForward::to_group_of(2)}},
      {"HSDP 2 x 2, bf16 parameters, f32 gradients", 4, 2,
       {.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32}}},
      {"3 ranks, frozen qkv and wpe", 3, 1, {}, true},
      {"3 ranks, QLoRA: NF4 projections gathered as packed rows", 3, 1, {}, false, true},
      {"2 ranks, QLoRA, reshard_after_forward false", 2, 1, {.reshard_after_forward = false}, false, true},
  };
  const auto freeze = [](nn::GPT& model) {
    for (const auto& [name, parameter] : model.named_parameters()) {
      if (name.find("attn.qkv.") != std::string::npos || name == "wpe.weight") parameter->set_requires_grad(false);
    }
  };
  const auto adapt = [](nn::GPT& model) { apply_qlora(model, "blocks.", 3); };
  const auto transform = [&](const Case& c) {
    return c.frozen ? std::function<void(nn::GPT&)>(freeze) : c.qlora ? std::function<void(nn::GPT&)>(adapt)
                                                                       : std::function<void(nn::GPT&)>();
  };
  int64_t unfrozen_reduce_scatter_sent = 0;  // the plain 3-rank case's, a step
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    nn::GPT meta_model(kAwkward, kMeta);
    if (c.frozen || c.qlora) transform(c)(meta_model);
    const ShardingPlan plan = plan_fully_shard(gpt_calls(meta_model, c.blocks), plan_mesh(c.world, c.replicate));
    const StepCommVolume comm = comm_per_step(plan);
    if (c.world == 3 && !c.blocks.reshard_after_forward && !c.frozen) {
      unfrozen_reduce_scatter_sent = comm.reduce_scatter_bytes_sent;
    }
    if (c.qlora) {
      // A block's all-gather: its 4 projections' packed rows (u8) and the
      // adapters' padded chunks (f32), each at a 16-byte boundary of a byte slot.
      const nn::Module& block = meta_model.blocks()[0];
      int64_t slot = 0;
      const auto aligned = [](int64_t bytes) { return (bytes + 15) / 16 * 16; };
      for (const auto& parameter : block.parameters()) {
        const int64_t rows = padded_shard_rows(parameter->sizes()[0], c.world);
        const int64_t row_bytes =
            (parameter->numel() / parameter->sizes()[0]) * element_size(parameter->tensor().dtype());
        slot += aligned(rows * row_bytes);
      }
      CHECK(plan.units[1].all_gather_slot_bytes == slot);
      // qkv's rows of 72 weights pack into 74 bytes (two blocks, two scale
      // codes, a step and a mean), against 288 in f32.
      CHECK(ops::nf4_row_bytes(72) == 74);
    }
    if (c.frozen) {
      // Each frozen parameter's chunk and flag leave every rank's gradient
      // slot: a step sends (S - 1) of them fewer, in f32.
      int64_t frozen_slot = 0;
      for (const auto& parameter : meta_model.parameters()) {
        if (parameter->requires_grad()) continue;
        frozen_slot += padded_shard_rows(parameter->sizes()[0], 3) * (parameter->numel() / parameter->sizes()[0]) + 1;
      }
      CHECK(frozen_slot > 0);
      CHECK(comm.reduce_scatter_bytes_sent == unfrozen_reduce_scatter_sent - 2 * 4 * frozen_slot);
    }
    dist::run_local(c.world, [&](const dist::ProcessGroupPtr& group) {
      const dist::DeviceMesh mesh =
          c.replicate == 1
              ? dist::DeviceMesh(group, kCPU, {c.world}, {"shard"})
              : dist::DeviceMesh(group, kCPU, {c.replicate, c.world / c.replicate}, {"replicate", "shard"});
      const int64_t baseline = dist::rank_memory_stats().live_bytes;
      ShardedGPT sharded = build_sharded_gpt(mesh, c.blocks, {}, transform(c));
      const int64_t shards = dist::rank_memory_stats().live_bytes - baseline;
      const ShardingPlan live = plan_of(*sharded.model);  // the groups fully_shard made
      // Two steps record the prefetch order; the third is FSDP's steady state.
      train_step(*sharded.model, group->rank());
      train_step(*sharded.model, group->rank());
      sharded.root->reset_unsharded_memory_peak();
      sharded.root->reset_communication_stats();
      for (const auto& param : sharded.model->parameters()) param->tensor().set_grad(Tensor());
      train_step(*sharded.model, group->rank());
      if (group->rank() != 0) return;  // rank 0 holds the most real rows: the plan's per-rank figures
      CAPTURE(name);

      CHECK(shards == plan.shard_bytes);  // every parameter's padded shard, allocated by to_empty
      CHECK(live.shard_bytes == plan.shard_bytes);
      CHECK(live.gradient_bytes == plan.gradient_bytes);
      CHECK(live.padding_bytes == plan.padding_bytes);
      CHECK(live.peak.bytes == plan.peak.bytes);
      CHECK(live.peak.moment == plan.peak.moment);
      CHECK(comm_per_step(live).total_sent() == comm.total_sent());
      CHECK(sharded.root->unsharded_memory().peak_bytes == plan.peak.bytes);
      const dist::CommStats stats = sharded.root->communication_stats();
      CHECK(stats[dist::CollectiveKind::all_gather].calls == comm.all_gather_calls);
      CHECK(stats[dist::CollectiveKind::all_gather].bytes_sent == comm.all_gather_bytes_sent);
      CHECK(stats[dist::CollectiveKind::reduce_scatter].calls == comm.reduce_scatter_calls);
      CHECK(stats[dist::CollectiveKind::reduce_scatter].bytes_sent == comm.reduce_scatter_bytes_sent);
      CHECK(stats[dist::CollectiveKind::all_reduce].calls == comm.all_reduce_calls);
      CHECK(stats[dist::CollectiveKind::all_reduce].bytes_sent == comm.all_reduce_bytes_sent);
      int64_t gradients = 0;
      for (const auto& param : sharded.model->parameters()) {
        const Tensor& grad = param->tensor().grad();
        if (grad.defined()) gradients += grad.numel() * static_cast<int64_t>(element_size(grad.dtype()));
      }
      CHECK(gradients == plan.gradient_bytes);
      for (const auto& parameter : sharded.model->parameters()) {
        if (!parameter->requires_grad()) CHECK_FALSE(parameter->tensor().grad().defined());
      }
    });
  }
}

TEST_CASE("plan: gradient accumulation keeps every group's unsharded gradients in param dtype, as allocated") {
  const FullyShardOptions blocks{.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32}};
  nn::GPT meta_model(kAwkward, kMeta);
  const ShardingPlan plan = plan_fully_shard(gpt_calls(meta_model, blocks), plan_mesh(3));
  int64_t trainable = 0;
  for (const auto& param : meta_model.parameters()) trainable += param->requires_grad() ? param->numel() : 0;
  CHECK(plan.accumulated_gradient_bytes == 2 * trainable);  // bf16, whole: no f32 copy
  CHECK(format_plan(plan).find("  accumulation  ") != std::string::npos);
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
    ShardedGPT sharded = build_sharded_gpt(dist::DeviceMesh(group, kCPU, {3}, {"shard"}), blocks);
    train_step(*sharded.model, group->rank());  // the first step sets FSDP up
    for (const auto& param : sharded.model->parameters()) param->tensor().set_grad(Tensor());
    // An unsynced micro-batch: what it leaves allocated is its gradients.
    sharded.root->set_requires_gradient_sync(false);
    const int64_t before = dist::rank_memory_stats().live_bytes;
    train_step(*sharded.model, group->rank());
    CHECK(dist::rank_memory_stats().live_bytes - before == plan.accumulated_gradient_bytes);
    sharded.root->set_requires_gradient_sync(true);
    train_step(*sharded.model, group->rank());  // the synced one reduces the sum and frees them
  });
}

TEST_CASE("plan: syncing every micro-batch keeps only the sharded gradients between micro-batches") {
  const FullyShardOptions blocks{.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32}};
  nn::GPT meta_model(kAwkward, kMeta);
  const ShardingPlan plan = plan_fully_shard(gpt_calls(meta_model, blocks), plan_mesh(3));
  dist::run_local(3, [&](const dist::ProcessGroupPtr& group) {
    ShardedGPT sharded = build_sharded_gpt(dist::DeviceMesh(group, kCPU, {3}, {"shard"}), blocks);
    train_step(*sharded.model, group->rank());  // the first step sets FSDP up
    for (const auto& param : sharded.model->parameters()) param->tensor().set_grad(Tensor());
    const int64_t before = dist::rank_memory_stats().live_bytes;
    for (int micro_batch = 0; micro_batch < 3; ++micro_batch) {
      CAPTURE(micro_batch);
      train_step(*sharded.model, group->rank());
      // The first makes the sharded gradients; the others add to them in place.
      int64_t gradients = 0;
      for (const auto& param : sharded.model->parameters()) {
        const Tensor& grad = param->tensor().grad();
        if (grad.defined()) gradients += grad.numel() * static_cast<int64_t>(element_size(grad.dtype()));
      }
      CHECK(dist::rank_memory_stats().live_bytes - before == gradients);
      if (group->rank() == 0) CHECK(gradients == plan.gradient_bytes);  // rank 0 has the most real rows
    }
  });
  // Against an unsynced accumulation's: the whole model's unsharded bf16
  // gradients (2 bytes a parameter) where this keeps a third of it in f32.
  CHECK(plan.accumulated_gradient_bytes > plan.gradient_bytes);
}

TEST_CASE("plan: bad worlds, meshes and call lists are refused with a clear error") {
  CHECK_THROWS_WITH_AS(plan_mesh(0), "sharding plan: the world size must be in [1, 1048576], got 0", Error);
  CHECK_THROWS_WITH_AS(plan_mesh(kMaxPlanRanks + 1), doctest::Contains("got 1048577"), Error);
  CHECK_THROWS_WITH_AS(plan_mesh(6, 4),
                       doctest::Contains("the replicate degree 4 must divide the world size 6"), Error);
  CHECK_THROWS_WITH_AS(plan_mesh(4, 0), doctest::Contains("the replicate degree 0 must divide"), Error);
  CHECK_THROWS_WITH_AS(check_mesh({.replicate = 2, .shard = 0}),
                       doctest::Contains("mesh (replicate=2, shard=0) must have sizes >= 1"), Error);
  CHECK_THROWS_WITH_AS(check_mesh({.replicate = 1024, .shard = 2048}), doctest::Contains("at most 1048576 ranks"),
                       Error);
  CHECK_NOTHROW(check_mesh(plan_mesh(1024, 8)));

  nn::GPT model(kAwkward, kMeta);
  CHECK_THROWS_WITH_AS(plan_fully_shard(gpt_calls(model), {.replicate = 1, .shard = -3}),
                       doctest::Contains("must have sizes >= 1"), Error);
  CHECK_THROWS_WITH_AS(plan_fully_shard({}, plan_mesh(2)), doctest::Contains("no fully_shard calls"), Error);
  CHECK_THROWS_WITH_AS(
      plan_fully_shard(gpt_calls(model, {.reshard_after_forward = ReshardAfterForward::to_group_of(3)}), plan_mesh(4)),
      doctest::Contains("reshard_after_forward = 3 must divide the shard group size 4"), Error);
  // The root first, then a block: the block's parameters are already the root's.
  CHECK_THROWS_WITH_AS(plan_fully_shard({{.module = &model, .options = {}}, {.module = &model.block(0), .options = {}}},
                                        plan_mesh(2)),
                       doctest::Contains("call 0 is on a GPT outside the root TransformerBlock (the last call's"),
                       Error);
  std::vector<PlannedCall> root_first = gpt_calls(model);
  root_first.insert(root_first.begin(), {.module = &model, .options = {}});
  CHECK_THROWS_WITH_AS(plan_fully_shard(root_first, plan_mesh(2)),
                       doctest::Contains("parameter 'blocks.0.ln1.weight' is already in the group of the root, which "
                                         "is not inside this module; apply fully_shard bottom-up"),
                       Error);
  std::vector<PlannedCall> block_twice = gpt_calls(model);
  block_twice.insert(block_twice.begin(), {.module = &model.block(0), .options = {}});
  CHECK_THROWS_WITH_AS(plan_fully_shard(block_twice, plan_mesh(2)),
                       doctest::Contains("call 1 is on TransformerBlock 'blocks.0' again"), Error);
  std::vector<PlannedCall> enclosing_first = {{.module = &model.block(0), .options = {}},
                                              {.module = &model, .options = {}}};
  enclosing_first.insert(enclosing_first.begin() + 1, {.module = &model.block(0).attn(), .options = {}});
  CHECK_THROWS_WITH_AS(plan_fully_shard(enclosing_first, plan_mesh(2)),
                       doctest::Contains("is already in the group of 'blocks.0', which is not inside this module"),
                       Error);
  nn::GPT other(kAwkward, kMeta);
  CHECK_THROWS_WITH_AS(plan_fully_shard({{.module = &other.block(0), .options = {}}, {.module = &model, .options = {}}},
                                        plan_mesh(2)),
                       doctest::Contains("call 0 is on a TransformerBlock outside the root GPT"), Error);
  std::vector<PlannedCall> with_mesh = gpt_calls(model);
  dist::run_local(1, [&](const dist::ProcessGroupPtr& group) {
    with_mesh.front().options.mesh = dist::DeviceMesh(group, kCPU, {1});
    CHECK_THROWS_WITH_AS(plan_fully_shard(with_mesh, plan_mesh(2)), doctest::Contains("sets FullyShardOptions::mesh"),
                         Error);
    with_mesh.front().options.mesh.reset();
  });
  // The tied head and embedding must share a group: wte alone may not take the weight lm_head reads.
  std::vector<PlannedCall> split_tie = gpt_calls(model);
  split_tie.insert(split_tie.begin(), {.module = &model.wte(), .options = {}});
  CHECK_THROWS_WITH_AS(plan_fully_shard(split_tie, plan_mesh(2)),
                       doctest::Contains("parameter 'wte.weight' is tied to 'lm_head.weight', which is outside 'wte'"),
                       Error);

  // A live plan needs materialised shards.
  dist::run_local(2, [&](const dist::ProcessGroupPtr& group) {
    nn::GPT meta(kAwkward, kMeta);
    const dist::DeviceMesh mesh(group, kCPU, {2});
    for (const auto& block : meta.blocks()) fully_shard(*block, {.mesh = mesh});
    fully_shard(meta, {.mesh = mesh});
    CHECK_THROWS_WITH_AS(plan_of(meta), doctest::Contains("is still on meta; call to_empty(device)"), Error);
  });
  nn::GPT plain(kAwkward, kMeta);
  CHECK_THROWS_WITH_AS(plan_of(plain), doctest::Contains("this GPT is not an FSDP module"), Error);
}
