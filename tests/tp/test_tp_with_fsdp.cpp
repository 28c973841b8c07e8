// Tensor parallelism composed with FSDP, as torchtitan composes them:
// parallelize on mesh["tp"], then fully_shard each block and the root on
// mesh["dp"] (or on (replicate, dp) for HSDP), then to_empty and
// reset_parameters. Against one rank on the global batch, for GPT and Llama:
//   - (dp 2, tp 2) and HSDP x TP (replicate 2, dp 2, tp 2) on thread ranks:
//     every parameter gathered (over dp, then tp) is the 1-rank init's bits;
//     the dp-averaged loss, every gradient, the clipped norm over both dims
//     and one AdamW step match within the tolerances of the TP-only tests;
//   - the sequence-parallel norms' partial gradients are summed over tp after
//     FSDP's reduce-scatter: one all-reduce of the shards per block;
//   - deterministic mode: (dp 2, tp 2) gives the gradients of (dp 1, tp 2)
//     with the batch as 2 micro-batches, bitwise;
//   - the refusals: fully_shard over a mesh that contains the tp ranks, and
//     reshard_after_forward as a group size on tensor-parallel parameters;
//   - fsdp::plan_fully_shard of a meta model parallelized on a planning mesh
//     (every tp coordinate) is plan_of the live model on that tp rank, and
//     the plan refuses what fully_shard refuses.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>

#include "autograd/engine.h"
#include "dist/backends/local_backend.h"
#include "fsdp/fully_shard.h"
#include "fsdp/plan.h"
#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#include "tensor/ops.h"
#include "tests/tp/composed_models.h"
#include "tp/plans.h"
#include "tp/traffic.h"

using namespace tessera;
using namespace tessera::tp::testing;
namespace ops = tessera::ops;

namespace {

void check_against_one_rank(const std::string& label, const ComposedFactory& make, int64_t replicate, int64_t dp,
                            int64_t tp) {
  const int64_t data_ranks = replicate * dp;
  auto reference = make(kMeta);
  reference->to_empty(kCPU);
  reference->reset_parameters(kComposedSeed);
  const nn::StateDict initial = reference->state_dict();
  std::map<std::string, Tensor> initial_copy;
  for (const auto& [name, tensor] : initial) initial_copy[name] = ops::clone(tensor);
  const Tensor idx = global_tokens(data_ranks, 1);
  const Tensor targets = global_tokens(data_ranks, 2);
  const ReferenceStep reference_run = reference_step(*reference, idx, targets);
  const Tensor& reference_loss = reference_run.loss;
  const std::map<std::string, Tensor>& reference_grads = reference_run.gradients;
  const double reference_norm = reference_run.norm;
  const nn::StateDict& stepped = reference_run.after;

  dist::run_local(
      static_cast<int>(replicate * dp * tp),
      [&](const dist::ProcessGroupPtr& world) {
        INFO(label, " on (replicate ", replicate, ", dp ", dp, ", tp ", tp, ")");
        const ComposedMesh meshes = composed_mesh(world, replicate, dp, tp);
        auto model = composed_model(make, meshes);
        for (const auto& [name, parameter] : model->named_parameters()) {
          CAPTURE(name);
          CHECK(parameter->is_sharded());
          CHECK(parameter->sharding()->mesh.size() == data_ranks);
          CHECK(worst_difference(gathered(*parameter, parameter->tensor()), initial_copy.at(name)) == 0.0);
        }
        const Tensor loss = model->loss(rows_of_dp_rank(idx, meshes.dp_rank), rows_of_dp_rank(targets, meshes.dp_rank));
        Tensor mean_loss = ops::div(ops::clone(loss.detach()), static_cast<double>(data_ranks));
        world->all_reduce(mean_loss, dist::ReduceOp::sum);  // over every rank: tp ranks agree, so / tp below
        CHECK(std::abs(doubles(mean_loss)[0] / static_cast<double>(tp) - doubles(reference_loss)[0]) <= 1e-5);
        autograd::backward(loss);
        for (const auto& [name, parameter] : model->named_parameters()) {
          CAPTURE(name);
          const Tensor want = reference_grads.at(name);
          CHECK(worst_difference(gathered(*parameter, parameter->grad()), want) <=
                1e-4 * std::max(largest_magnitude(want), 1e-6));
        }
        const double norm = optim::clip_grad_norm_(model->parameters(), 1e9);
        CHECK(std::abs(norm - reference_norm) <= 1e-5 * reference_norm);
        optim::AdamW optimizer(model->named_parameters(), kComparableAdamW);
        optimizer.step();
        for (const auto& [name, parameter] : model->named_parameters()) {
          CAPTURE(name);
          const Tensor want = stepped.at(name);
          CHECK(worst_difference(gathered(*parameter, parameter->tensor()), want) <=
                1e-5 * std::max(largest_magnitude(want), 1.0));
        }
      },
      thread_rank_options());
}

}  // namespace

TEST_CASE("tp x fsdp (dp 2, tp 2): init bitwise, loss, gradients, norm and a step as one rank on the global batch") {
  for (const auto& [label, make] : composed_models()) check_against_one_rank(label, make, 1, 2, 2);
}

TEST_CASE("tp x hsdp (replicate 2, dp 2, tp 2) on 8 thread ranks: as one rank on the global batch") {
  for (const auto& [label, make] : composed_models()) check_against_one_rank(label, make, 2, 2, 2);
}

TEST_CASE("tp x fsdp: partial gradients summed over tp after the reduce-scatter, one all-reduce of shards a block") {
  dist::run_local(
      4,
      [](const dist::ProcessGroupPtr& world) {
        const ComposedMesh meshes = composed_mesh(world, 1, 2, 2);
        auto model = composed_model(composed_models()[0].second, meshes);
        for (const auto& parameter : model->parameters()) CHECK_FALSE(parameter->sums_partial_gradient());
        const dist::ProcessGroupPtr& tp_group = meshes.tp.group(0);
        const Tensor idx = rows_of_dp_rank(global_tokens(2, 3), meshes.dp_rank);
        tp_group->reset_stats();
        const Tensor loss = model->loss(idx, idx);
        const dist::CommStats forward = tp_group->stats();
        tp_group->reset_stats();
        autograd::backward(loss);
        // The activations' moves are tp::plan_traffic's; the partial sums are FSDP's.
        const tp::TensorParallelTraffic planned =
            tp::plan_traffic(*model, {.batch = kRowsPerDpRank, .seq_len = kComposedSequence,
                                      .activation_dtype = DType::f32, .fsdp_sums_partial_gradients = true});
        for (const auto kind : {dist::CollectiveKind::all_gather, dist::CollectiveKind::reduce_scatter}) {
          CHECK(forward[kind].bytes_sent == planned.forward[kind].bytes_sent);
          CHECK(tp_group->stats()[kind].bytes_sent == planned.backward[kind].bytes_sent);
          CHECK(tp_group->stats()[kind].calls == planned.backward[kind].calls);
        }
        const auto all_reduce_kind = dist::CollectiveKind::all_reduce;
        CHECK(forward[all_reduce_kind].calls == planned.forward[all_reduce_kind].calls);
        // ln1, ln2, attn.proj.bias, mlp.proj.bias in each block, ln_f's two in
        // the root: one all-reduce a group, of the dp shards packed together.
        const nn::GPTConfig config = composed_gpt();
        const int64_t groups = config.n_layer + 1;
        const dist::CollectiveStats all_reduce = tp_group->stats()[dist::CollectiveKind::all_reduce];
        CHECK(all_reduce.calls == groups);
        // Per block 6 vectors of C (each C / dp rows a shard), ln_f's 2; f32;
        // an all-reduce of S bytes sends 2 (N - 1) / N S: S here.
        const int64_t shard_bytes = (6 * config.n_layer + 2) * (config.n_embd / 2) * 4;
        CHECK(all_reduce.bytes_sent == shard_bytes);
      },
      thread_rank_options());
}

TEST_CASE("tp x fsdp: refusals") {
  dist::run_local(
      4,
      [](const dist::ProcessGroupPtr& world) {
        const ComposedMesh meshes = composed_mesh(world, 1, 2, 2);
        auto model = std::make_shared<nn::GPT>(composed_gpt(), kMeta);
        tp::parallelize_gpt(*model, meshes.tp);
        // Sharding over the tp ranks themselves (or the whole world).
        CHECK_THROWS_WITH_AS(fsdp::fully_shard(model->block(0), {.mesh = meshes.tp}),
                             doctest::Contains("shares ranks with the tensor-parallel group"), Error);
        CHECK_THROWS_WITH_AS(fsdp::fully_shard(model->block(0), {.mesh = dist::DeviceMesh(world, kCPU, {4})}),
                             doctest::Contains("shares ranks with the tensor-parallel group"), Error);
        // reshard_after_forward as a group size.
        auto four_dp = std::make_shared<nn::GPT>(composed_gpt(), kMeta);
        dist::DeviceMesh wide(world, kCPU, {4, 1}, {"dp", "tp"});
        tp::parallelize_gpt(*four_dp, wide["tp"]);
        CHECK_THROWS_WITH_AS(
            fsdp::fully_shard(four_dp->block(0), {.mesh = wide["dp"],
                                                  .reshard_after_forward = fsdp::ReshardAfterForward::to_group_of(2)}),
            doctest::Contains("reshard_after_forward = 2 on tensor-parallel parameters"), Error);
      },
      thread_rank_options());
}

TEST_CASE("tp x fsdp, deterministic: (dp 2, tp 2) is (dp 1, tp 2) with the batch as 2 micro-batches, bitwise") {
  dist::LocalOptions deterministic = thread_rank_options();
  deterministic.group.deterministic = true;
  const Tensor idx = global_tokens(2, 5);
  const Tensor targets = global_tokens(2, 6);
  for (const auto& [label, make] : composed_models()) {
    // One data rank: both halves of the batch in turn, the gradients summed
    // on the rank and reduce-scattered after the second; their mean is the
    // sum halved (exactly: a power of two).
    std::map<std::string, Tensor> accumulated;
    dist::run_local(
        2,
        [&](const dist::ProcessGroupPtr& world) {
          const ComposedMesh meshes = composed_mesh(world, 1, 1, 2);
          auto model = composed_model(make, meshes);
          std::optional<fsdp::FSDPModule> root = fsdp::fsdp_module(*model);
          REQUIRE(root.has_value());
          for (int64_t micro = 0; micro < 2; ++micro) {
            root->set_requires_gradient_sync(micro == 1);
            autograd::backward(model->loss(rows_of_dp_rank(idx, micro), rows_of_dp_rank(targets, micro)));
          }
          for (const auto& [name, parameter] : model->named_parameters()) {
            const Tensor mean = ops::mul(gathered(*parameter, parameter->grad()), 0.5);
            if (world->rank() == 0) accumulated[name] = mean;
          }
        },
        deterministic);
    dist::run_local(
        4,
        [&](const dist::ProcessGroupPtr& world) {
          INFO(label);
          const ComposedMesh meshes = composed_mesh(world, 1, 2, 2);
          auto model = composed_model(make, meshes);
          autograd::backward(
              model->loss(rows_of_dp_rank(idx, meshes.dp_rank), rows_of_dp_rank(targets, meshes.dp_rank)));
          for (const auto& [name, parameter] : model->named_parameters()) {
            CAPTURE(name);
            CHECK(worst_difference(gathered(*parameter, parameter->grad()), accumulated.at(name)) == 0.0);
          }
        },
        deterministic);
  }
}

TEST_CASE("tp x fsdp: the plan of a planning-mesh layout is each tp rank's live plan; its refusals") {
  for (const auto& [label, make] : composed_models()) {
    CAPTURE(label);
    // The plan of tp coordinate c of (dp 2, tp 2), made without a rank.
    std::vector<fsdp::ShardingPlan> planned;
    for (int64_t coordinate = 0; coordinate < 2; ++coordinate) {
      auto meta = make(kMeta);
      tp::parallelize_causal_lm(*meta, dist::DeviceMesh::planning(kCPU, {2}, {"tp"}, {coordinate}));
      std::vector<fsdp::PlannedCall> calls;
      for (auto& block : meta->blocks()) calls.push_back({.module = block.get(), .options = {}});
      calls.push_back({.module = meta.get(), .options = {}});
      planned.push_back(fsdp::plan_fully_shard(calls, {.replicate = 1, .shard = 2, .tensor_parallel = 2}));
    }
    // The vocabulary of 61 rows: 31 on tp rank 0, 30 on tp rank 1.
    CHECK(planned[0].units.front().params.front().global_shape[0] == 31);
    CHECK(planned[1].units.front().params.front().global_shape[0] == 30);
    dist::run_local(
        4,
        [&](const dist::ProcessGroupPtr& world) {
          const ComposedMesh meshes = composed_mesh(world, 1, 2, 2);
          auto model = composed_model(make, meshes);
          const fsdp::ShardingPlan live = fsdp::plan_of(*model);
          const fsdp::ShardingPlan& plan = planned[static_cast<size_t>(meshes.tp.coordinate(0))];
          CHECK(live.mesh == plan.mesh);
          CHECK(live.shard_bytes == plan.shard_bytes);
          CHECK(live.gradient_bytes == plan.gradient_bytes);
          CHECK(live.peak.bytes == plan.peak.bytes);
          REQUIRE(live.units.size() == plan.units.size());
          for (size_t unit = 0; unit < plan.units.size(); ++unit) {
            CHECK(live.units[unit].partial_gradient_numel == plan.units[unit].partial_gradient_numel);
            for (size_t param = 0; param < plan.units[unit].params.size(); ++param) {
              CAPTURE(plan.units[unit].params[param].fqn);
              CHECK(live.units[unit].params[param].global_shape == plan.units[unit].params[param].global_shape);
              CHECK(live.units[unit].params[param].logical_shape == plan.units[unit].params[param].logical_shape);
              CHECK(live.units[unit].params[param].tensor_parallel == plan.units[unit].params[param].tensor_parallel);
            }
          }
          // A step's FSDP collectives, the partial sums over tp included, are the plan's.
          const fsdp::StepCommVolume expected = fsdp::comm_per_step(plan);
          fsdp::fsdp_module(*model)->reset_communication_stats();
          const Tensor idx = rows_of_dp_rank(global_tokens(2, 3), meshes.dp_rank);
          autograd::backward(model->loss(idx, idx));
          const dist::CommStats sent = fsdp::fsdp_module(*model)->communication_stats();
          CHECK(sent[dist::CollectiveKind::all_gather].bytes_sent == expected.all_gather_bytes_sent);
          CHECK(sent[dist::CollectiveKind::reduce_scatter].bytes_sent == expected.reduce_scatter_bytes_sent);
          CHECK(sent[dist::CollectiveKind::all_reduce].bytes_sent == expected.partial_gradient_bytes_sent);
          CHECK(fsdp::fsdp_module(*model)->tensor_parallel_communication_stats().total().bytes_sent ==
                expected.partial_gradient_bytes_sent);
          CHECK(expected.partial_gradient_calls == static_cast<int64_t>(model->blocks().size()) + 1);
        },
        thread_rank_options());
  }
  auto meta = std::make_shared<nn::GPT>(composed_gpt(), kMeta);
  tp::parallelize_gpt(*meta, dist::DeviceMesh::planning(kCPU, {2}, {"tp"}, {0}));
  const std::vector<fsdp::PlannedCall> calls = {{.module = meta.get(), .options = {}}};
  CHECK_THROWS_WITH_AS(fsdp::plan_fully_shard(calls, {.replicate = 1, .shard = 2, .tensor_parallel = 4}),
                       doctest::Contains("but the plan's mesh (shard=2, tp=4) has tp=4"), Error);
  const std::vector<fsdp::PlannedCall> regrouped = {
      {.module = meta.get(), .options = {.reshard_after_forward = fsdp::ReshardAfterForward::to_group_of(2)}}};
  CHECK_THROWS_WITH_AS(fsdp::plan_fully_shard(regrouped, {.replicate = 1, .shard = 4, .tensor_parallel = 2}),
                       doctest::Contains("reshard_after_forward = 2 on tensor-parallel parameters"), Error);
  auto whole = std::make_shared<nn::GPT>(composed_gpt(), kMeta);
  CHECK_THROWS_WITH_AS(
      fsdp::plan_fully_shard({{.module = whole.get(), .options = {}}}, {.replicate = 1, .shard = 2,
                                                                        .tensor_parallel = 2}),
      doctest::Contains("has tp=2, but parameter 'wte.weight' is not tensor-parallel"), Error);
  CHECK_THROWS_WITH_AS(fsdp::plan_mesh(8, 2, 3), doctest::Contains("the tp size 3 with the replicate degree 2"),
                       Error);
  CHECK(fsdp::plan_mesh(8, 2, 2).to_string() == "(replicate=2, shard=2, tp=2)");
}
