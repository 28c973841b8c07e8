// The tensor-parallel step's run: (dp, tp) local ranks, parallelize then
// fully_shard (torchtitan's order), a traced and measured step, and one rank
// on the same global batches.
#include "examples/fsdp_figures/tp_step_run.h"

#include <fmt/format.h>

#include <memory>

#include "autograd/engine.h"
#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "fsdp/fully_shard.h"
#include "nn/models/gpt.h"
#include "tensor/error.h"
#include "tp/plans.h"

namespace fsdp_figures {

namespace dist = tessera::dist;
namespace fsdp = tessera::fsdp;
namespace nn = tessera::nn;
using tessera::Tensor;

namespace {

int64_t live_bytes_now() { return dist::rank_memory_stats().live_bytes; }

// Every parameter's layout, read from rank (0, c)'s model for each tp rank c.
std::vector<LaidOutParameter> layout_of(const TensorParallelOptions& options) {
  std::vector<LaidOutParameter> parameters;
  for (int coordinate = 0; coordinate < options.tp; ++coordinate) {
    nn::GPT model(options.run.model, tessera::kMeta);
    tessera::tp::parallelize_gpt(
        model, dist::DeviceMesh::planning(tessera::kCPU, {options.tp}, {"tp"}, {coordinate}));
    size_t index = 0;
    for (const auto& [name, parameter] : model.named_parameters()) {
      const auto& spec = parameter->tensor_parallel();
      if (coordinate == 0) {
        const std::string unit = name.rfind("blocks.", 0) == 0 ? name.substr(0, name.find('.', 7)) : "root";
        parameters.push_back({.name = name,
                              .unit = unit,
                              .logical = spec->global_shape,
                              .placement = dist::placement_name(spec->placement),
                              .sections = spec->sections,
                              .partial_gradient = spec->partial_gradient,
                              .pieces = {}});
      }
      parameters[index++].pieces.push_back(parameter->tensor().sizes());
    }
  }
  return parameters;
}

// One rank's memory now, from what holds the bytes; `shards` is read once
// the model is sharded (a gathered parameter's tensor is the unsharded one,
// while its shard stays allocated).
MemoryReading read_memory(const std::string& stage, nn::GPT& model, fsdp::FSDPModule& root,
                                  tessera::optim::AdamW& optimizer, int64_t baseline, int64_t shards) {
  MemoryReading reading{.stage = stage};
  reading.live = live_bytes_now() - baseline;
  reading.shards = shards;
  reading.unsharded = root.unsharded_memory(/*recurse=*/true).live_bytes;
  std::vector<Tensor> held;
  for (const auto& parameter : model.parameters()) held.push_back(parameter->grad());
  reading.gradients = storage_bytes(held);
  held.clear();
  for (const std::string& name : optimizer.param_names()) {
    for (const auto& [key, tensor] : optimizer.state(name)) held.push_back(tensor);
  }
  reading.optimizer = storage_bytes(held);
  return reading;
}

struct SharedTensorParallelRun {
  TensorParallelRun run;
  std::shared_ptr<dist::Tracer> tracer = std::make_shared<dist::Tracer>();
};

void train_rank(const dist::ProcessGroupPtr& world, const TensorParallelOptions& options, SharedTensorParallelRun& shared) {
  const int64_t baseline = live_bytes_now();
  const int rank = world->rank();
  const dist::DeviceMesh mesh(world, tessera::kCPU, {options.dp, options.tp}, {"dp", "tp"});
  const dist::ProcessGroupPtr& tp_group = mesh.group("tp");
  const dist::ProcessGroupPtr& dp_group = mesh.group("dp");

  nn::GPT model(options.run.model, tessera::kMeta);
  tessera::tp::parallelize_gpt(model, mesh["tp"]);
  for (int64_t index = 0; index < model.blocks().size(); ++index) {
    fsdp::fully_shard(model.blocks()[index], {.mesh = mesh["dp"]});
  }
  fsdp::FSDPModule root = fsdp::fully_shard(model, {.mesh = mesh["dp"]});
  model.to_empty(tessera::kCPU);
  model.reset_parameters(options.run.seed);
  auto optimizer = make_optimizer(model.named_parameters(), options.run);
  std::vector<Tensor> shard_tensors;
  for (const auto& parameter : model.parameters()) shard_tensors.push_back(parameter->tensor());
  const int64_t shards = storage_bytes(shard_tensors);
  const auto read = [&](const char* stage) { return read_memory(stage, model, root, *optimizer, baseline, shards); };

  TensorParallelRank& record = shared.run.ranks[static_cast<size_t>(rank)];
  record.dp = static_cast<int>(mesh.coordinate(0));
  record.tp = static_cast<int>(mesh.coordinate(1));
  for (int64_t step = 0; step < options.steps; ++step) {
    const bool traced = step + 1 == options.traced_step;
    dist::Tracer* tracer = traced ? shared.tracer.get() : nullptr;
    optimizer->zero_grad();
    // The tp ranks of a dp rank read its micro-batch.
    const MicroBatch batch = micro_batch(options.run, step, record.dp);
    if (traced) {
      world->barrier();
      for (const auto& group : {tp_group, dp_group}) {
        group->reset_stats();
        group->set_tracer(shared.tracer);  // the dp group's also traces FSDP's phases
      }
      root.reset_communication_stats();
      dist::reset_rank_peak_memory();
      record.memory.push_back(read("start"));
    }
    Tensor loss;
    {
      dist::TraceSpan span(tracer, rank, "compute", "forward", "train");
      loss = model.loss(batch.inputs, batch.targets);
    }
    if (traced) record.memory.push_back(read("loss"));
    {
      dist::TraceSpan span(tracer, rank, "compute", "backward", "train");
      tessera::autograd::backward(loss);
    }
    if (traced) record.memory.push_back(read("grads"));
    {
      dist::TraceSpan span(tracer, rank, "compute", "optimizer", "train");
      optimizer->step();
    }
    if (traced) {
      record.memory.push_back(read("step"));
      record.peak = dist::rank_memory_stats().peak_bytes - baseline;
      record.groups["tp"] = tp_group->stats();
      record.groups["dp"] = dp_group->stats();
      record.fsdp = root.communication_stats();
      record.fsdp_over_tp = root.tensor_parallel_communication_stats();
      for (const auto& group : {tp_group, dp_group}) group->set_tracer(nullptr);
    }
    // tp ranks hold the same loss: the mean over the world is the dp mean.
    const double mean = mean_over_ranks(world, loss.item());
    if (rank == 0) shared.run.losses.push_back(mean);
  }
}

}  // namespace

TensorParallelRun run_tensor_parallel(const TensorParallelOptions& options) {
  TESSERA_CHECK(options.dp >= 1 && options.tp >= 2, "tp_figures: dp {} and tp {}: tp must be >= 2", options.dp,
                options.tp);
  TESSERA_CHECK(options.traced_step >= 1 && options.traced_step <= options.steps,
                "tp_figures: the traced step {} is not among steps 1..{}", options.traced_step, options.steps);
  SharedTensorParallelRun shared;
  shared.run.options = options;
  shared.run.parameters = layout_of(options);
  shared.run.ranks.resize(static_cast<size_t>(options.ranks()));
  dist::LocalOptions local;
  local.threads_per_rank = 1;  // as the one-rank run
  dist::run_local(options.ranks(), [&](const dist::ProcessGroupPtr& world) { train_rank(world, options, shared); },
                  local);
  shared.run.events = shared.tracer->events();
  RunOptions one_rank = options.run;
  one_rank.ranks = options.dp;  // the dp ranks' micro-batches, accumulated
  one_rank.steps = options.steps;
  shared.run.one_rank = run_one_rank(one_rank);
  return std::move(shared.run);
}

}  // namespace fsdp_figures
