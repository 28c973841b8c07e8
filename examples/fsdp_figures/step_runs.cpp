// The runs of the FSDP step pictures: data, the three trainings, and what the
// traced step records (the memory readings at hooks, comm stats, the trace).
#include "examples/fsdp_figures/step_runs.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <set>

#include "autograd/engine.h"
#include "autograd/hooks.h"
#include "dist/backends/local_backend.h"
#include "dist/device_mesh.h"
#include "fsdp/fully_shard.h"
#include "fsdp/naive_fsdp.h"
#include "nn/models/gpt.h"
#include "nn/optim/adamw.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"
#include "tensor/storage.h"

namespace fsdp_figures {

namespace dist = tessera::dist;
namespace fsdp = tessera::fsdp;
namespace nn = tessera::nn;
namespace ops = tessera::ops;
namespace optim = tessera::optim;
using tessera::Tensor;

namespace {

// The data's alphabet and strides: few enough that a few dozen steps learn them.
constexpr uint64_t kDataTokens = 32;
constexpr uint64_t kStrides = 4;

// The model on meta, allocated and initialised as FSDP2's recipe does it (on
// a sharded model each rank fills only its rows, with the unsharded values).
void materialize(nn::GPT& model, const RunOptions& options) {
  model.to_empty(tessera::kCPU);
  model.reset_parameters(options.seed);
}

int64_t rank_live_bytes() { return dist::rank_memory_stats().live_bytes; }

// Each rank's part of a sharded run, written by its own thread.
struct SharedRun {
  ShardedRun run;
  std::shared_ptr<dist::Tracer> tracer;
  SharedRun(int ranks, bool trace) : tracer(trace ? std::make_shared<dist::Tracer>() : nullptr) {
    if (trace) run.ranks.resize(static_cast<size_t>(ranks));
  }
};

dist::LocalOptions local_options(bool deterministic) {
  dist::LocalOptions options;
  options.group.deterministic = deterministic;
  options.threads_per_rank = 1;  // as the one-rank run: GEMM blocking follows the thread count
  return options;
}

// ---- fully_shard ------------------------------------------------------------------------------

using NamedUnits = std::vector<std::pair<std::string, fsdp::FSDPModule>>;

// FSDP2's recipe: build on meta, fully_shard bottom-up (the blocks, then the
// root), materialise. Returns the units, the root last.
NamedUnits shard_bottom_up(nn::GPT& model, const dist::DeviceMesh& mesh, const RunOptions& options) {
  NamedUnits units;
  for (int64_t index = 0; index < model.blocks().size(); ++index) {
    units.emplace_back(fmt::format("blocks.{}", index),
                       fsdp::fully_shard(model.blocks()[index],
                                         {.mesh = mesh, .reshard_after_forward = options.reshard_after_forward}));
  }
  units.emplace_back("root", fsdp::fully_shard(model, {.mesh = mesh}));
  if (!options.prefetch) {
    for (auto& [name, unit] : units) {
      unit.set_modules_to_forward_prefetch({});
      unit.set_modules_to_backward_prefetch({});
    }
  }
  materialize(model, options);
  return units;
}

// One rank's memory at the stages of the traced step (MemoryReading), read
// by hooks registered after fully_shard's, so they run after FSDP's: a
// pre-forward reading sees its unit gathered and the next one's all-gather
// issued; a reading in the gradient hook of a block's output sees the block
// gathered again and the previous one's all-gather issued.
class MemoryProbe {
 public:
  MemoryProbe(nn::GPT& model, const NamedUnits& units, optim::AdamW& optimizer, int64_t baseline)
      : model_(model), units_(units), optimizer_(optimizer), baseline_(baseline) {
    std::vector<Tensor> shards;
    for (const auto& parameter : model_.parameters()) shards.push_back(parameter->tensor());
    shard_bytes_ = storage_bytes(shards);  // every unit is sharded now
  }

  void register_hooks() {
    model_.register_forward_pre_hook([this](nn::Module&, const nn::TensorList&) -> std::optional<nn::TensorList> {
      read("fwd root");
      return std::nullopt;
    });
    for (int64_t index = 0; index < model_.blocks().size(); ++index) {
      nn::Module& block = model_.blocks()[index];
      block.register_forward_pre_hook(
          [this, index](nn::Module&, const nn::TensorList&) -> std::optional<nn::TensorList> {
            read(fmt::format("fwd {}", index));
            return std::nullopt;
          });
      block.register_forward_hook(
          [this, index](nn::Module&, const nn::TensorList&, const Tensor& output) -> std::optional<Tensor> {
            if (readings_ != nullptr && output.requires_grad()) {
              Tensor hooked = output;
              tessera::autograd::register_hook(hooked, [this, index](const Tensor&) {
                read(fmt::format("bwd {}", index));
                return Tensor();
              });
            }
            return std::nullopt;
          });
    }
  }

  // Readings go to `readings` until stop(); none are taken otherwise.
  void start(std::vector<MemoryReading>* readings) { readings_ = readings; }
  void stop() { readings_ = nullptr; }

  void read(std::string stage) {
    if (readings_ == nullptr) return;
    MemoryReading reading{.stage = std::move(stage)};
    reading.live = rank_live_bytes() - baseline_;
    reading.shards = shard_bytes_;
    reading.unsharded = units_.back().second.unsharded_memory(/*recurse=*/true).live_bytes;  // the root's tree
    for (const auto& [name, unit] : units_) reading.unsharded_by_unit[name] = unit.unsharded_memory(false).live_bytes;
    std::vector<Tensor> held;
    for (const auto& parameter : model_.parameters()) held.push_back(parameter->grad());
    reading.gradients = storage_bytes(held);
    held.clear();
    for (const std::string& name : optimizer_.param_names()) {
      for (const auto& [key, tensor] : optimizer_.state(name)) held.push_back(tensor);
    }
    reading.optimizer = storage_bytes(held);
    readings_->push_back(std::move(reading));
  }

 private:
  nn::GPT& model_;
  const NamedUnits& units_;
  optim::AdamW& optimizer_;
  int64_t baseline_;
  int64_t shard_bytes_ = 0;
  std::vector<MemoryReading>* readings_ = nullptr;
};

// The traced step's counters and trace: reset and switched on at its start
// (once the ranks have met, so nothing earlier is counted), read and switched
// off at its end (every collective of the step is complete by then).
void begin_traced_step(const dist::ProcessGroupPtr& world, const std::vector<dist::ProcessGroupPtr>& groups,
                       NamedUnits& units, const std::shared_ptr<dist::Tracer>& tracer) {
  world->barrier();
  for (const auto& group : groups) {
    group->reset_stats();
    group->set_tracer(tracer);
  }
  for (auto& [name, unit] : units) unit.reset_communication_stats(/*recurse=*/false);
  dist::reset_rank_peak_memory();
}

void end_traced_step(const std::vector<dist::ProcessGroupPtr>& groups, const NamedUnits& units, int64_t baseline,
                     RankStep& record) {
  record.peak = dist::rank_memory_stats().peak_bytes - baseline;
  for (const auto& group : groups) {
    record.group_comm[group->name()] = group->stats();
    group->set_tracer(nullptr);
  }
  for (const auto& [name, unit] : units) record.unit_comm[name] = unit.communication_stats(/*recurse=*/false);
}

void fully_shard_rank(const dist::ProcessGroupPtr& world, const RunOptions& options, SharedRun& shared) {
  const int64_t baseline = rank_live_bytes();
  const int rank = world->rank();
  const int shards = options.ranks / options.replicate;
  const dist::DeviceMesh mesh =
      options.replicate > 1
          ? dist::DeviceMesh(world, tessera::kCPU, {options.replicate, shards}, {"replicate", "shard"})
          : dist::DeviceMesh(world, tessera::kCPU, {shards}, {"shard"});
  std::vector<dist::ProcessGroupPtr> groups;
  for (int64_t dim = 0; dim < mesh.ndim(); ++dim) groups.push_back(mesh.group(dim));

  nn::GPT model(options.model, tessera::kMeta);
  NamedUnits units = shard_bottom_up(model, mesh, options);
  RankStep* record = shared.run.ranks.empty() ? nullptr : &shared.run.ranks[static_cast<size_t>(rank)];
  if (record != nullptr) record->shards_allocated = rank_live_bytes() - baseline;
  auto optimizer = make_optimizer(model.named_parameters(), options);
  MemoryProbe probe(model, units, *optimizer, baseline);
  probe.register_hooks();

  for (int64_t step = 0; step < options.steps; ++step) {
    const bool traced = record != nullptr && step + 1 == options.traced_step;
    dist::Tracer* tracer = traced ? shared.tracer.get() : nullptr;
    optimizer->zero_grad();
    const MicroBatch batch = micro_batch(options, step, rank);
    if (traced) {
      begin_traced_step(world, groups, units, shared.tracer);
      probe.start(&record->memory);
      probe.read("start");
    }
    Tensor loss;
    {
      dist::TraceSpan span(tracer, rank, "compute", "forward", "train");
      loss = model.loss(batch.inputs, batch.targets);
    }
    probe.read("loss");
    {
      dist::TraceSpan span(tracer, rank, "compute", "backward", "train");
      tessera::autograd::backward(loss);
    }
    probe.read("grads");
    {
      dist::TraceSpan span(tracer, rank, "compute", "optimizer", "train");
      optimizer->step();
    }
    probe.read("step");
    if (traced) {
      probe.stop();
      end_traced_step(groups, units, baseline, *record);
    }
    const double mean = mean_over_ranks(world, loss.item());
    if (rank == 0) shared.run.losses.push_back(mean);
  }
}

// ---- NaiveFSDP --------------------------------------------------------------------------------

void naive_rank(const dist::ProcessGroupPtr& world, const RunOptions& options, SharedRun& shared) {
  const int64_t baseline = rank_live_bytes();
  const int rank = world->rank();
  nn::GPT model(options.model, tessera::kMeta);
  materialize(model, options);  // whole, on every rank: NaiveFSDP cuts the shards from it
  fsdp::NaiveFSDP naive(model, world);
  RankStep& record = shared.run.ranks[static_cast<size_t>(rank)];
  record.shards_allocated = rank_live_bytes() - baseline;
  auto optimizer = make_optimizer(naive.shards(), options);
  for (int64_t step = 0; step < options.steps; ++step) {
    const bool traced = step + 1 == options.traced_step;
    dist::Tracer* tracer = traced ? shared.tracer.get() : nullptr;
    optimizer->zero_grad();
    const MicroBatch batch = micro_batch(options, step, rank);
    if (traced) {
      world->barrier();  // as begin_traced_step, on NaiveFSDP's one group
      world->reset_stats();
      world->set_tracer(shared.tracer);
      dist::reset_rank_peak_memory();
    }
    {
      dist::TraceSpan span(tracer, rank, "fsdp", "gather", "naive");
      naive.gather();
    }
    Tensor loss;
    {
      dist::TraceSpan span(tracer, rank, "compute", "forward", "train");
      loss = model.loss(batch.inputs, batch.targets);
    }
    {
      dist::TraceSpan span(tracer, rank, "compute", "backward", "train");
      tessera::autograd::backward(loss);
    }
    {
      dist::TraceSpan span(tracer, rank, "fsdp", "reduce_scatter_gradients", "naive");
      naive.reduce_scatter_gradients();
    }
    {
      dist::TraceSpan span(tracer, rank, "compute", "optimizer", "train");
      optimizer->step();
    }
    if (traced) {
      record.peak = dist::rank_memory_stats().peak_bytes - baseline;
      record.group_comm[world->name()] = world->stats();
      world->set_tracer(nullptr);
    }
    const double mean = mean_over_ranks(world, loss.item());
    if (rank == 0) shared.run.losses.push_back(mean);
  }
}

}  // namespace

std::unique_ptr<optim::AdamW> make_optimizer(const std::vector<nn::NamedParameter>& parameters,
                                             const RunOptions& options) {
  return std::make_unique<optim::AdamW>(optim::weight_decay_groups(parameters, 0.1),
                                        optim::AdamWOptions{.lr = options.lr, .beta1 = 0.9, .beta2 = 0.95,
                                                            .weight_decay = 0.1});
}

int64_t storage_bytes(const std::vector<Tensor>& tensors) {
  std::set<const tessera::Storage*> seen;
  int64_t bytes = 0;
  for (const Tensor& tensor : tensors) {
    if (!tensor.defined() || tensor.storage() == nullptr || tensor.storage()->is_released()) continue;
    if (seen.insert(tensor.storage().get()).second) bytes += tensor.storage()->bytes();
  }
  return bytes;
}

double mean_over_ranks(const dist::ProcessGroupPtr& world, double loss) {
  Tensor total = ops::scalar_tensor(loss, {.dtype = tessera::DType::f64});
  world->all_reduce(total, dist::ReduceOp::sum);
  return total.item() / static_cast<double>(world->size());
}

MicroBatch micro_batch(const RunOptions& options, int64_t step, int64_t index) {
  // mt19937_64's outputs are fixed by the C++ standard (its distributions are not): the same tokens everywhere.
  std::mt19937_64 generator(options.seed * 1000003ULL + static_cast<uint64_t>(step) * 4099ULL +
                            static_cast<uint64_t>(index));
  const uint64_t tokens = std::min<uint64_t>(kDataTokens, static_cast<uint64_t>(options.model.vocab_size));
  std::vector<int64_t> inputs, targets;
  for (int64_t row = 0; row < options.batch; ++row) {
    uint64_t token = generator() % tokens;
    const uint64_t stride = 1 + generator() % kStrides;
    for (int64_t position = 0; position < options.seq_len; ++position) {
      inputs.push_back(static_cast<int64_t>(token));
      token = (token + stride) % tokens;
      targets.push_back(static_cast<int64_t>(token));
    }
  }
  return {ops::from_vector(inputs, {options.batch, options.seq_len}),
          ops::from_vector(targets, {options.batch, options.seq_len})};
}

std::vector<Unit> fsdp_units(const RunOptions& options) {
  const nn::GPT model(options.model, tessera::kMeta);
  std::vector<Unit> units;
  for (int64_t index = 0; index < model.blocks().size(); ++index) {
    units.push_back({fmt::format("blocks.{}", index), {}});
  }
  units.push_back({"root", {}});
  for (const auto& [name, parameter] : model.named_parameters()) {
    Unit* owner = &units.back();
    for (Unit& unit : units) {
      if (name.rfind(unit.module + ".", 0) == 0) owner = &unit;
    }
    owner->parameters.push_back({name, parameter->global_shape()});
  }
  return units;
}

ShardedRun run_fully_shard(const RunOptions& options, bool deterministic, bool trace) {
  SharedRun shared(options.ranks, trace);
  dist::run_local(options.ranks, [&](const dist::ProcessGroupPtr& world) { fully_shard_rank(world, options, shared); },
                  local_options(deterministic));
  if (trace) shared.run.events = shared.tracer->events();
  return std::move(shared.run);
}

ShardedRun run_naive(const RunOptions& options) {
  SharedRun shared(options.ranks, /*trace=*/true);
  dist::run_local(options.ranks, [&](const dist::ProcessGroupPtr& world) { naive_rank(world, options, shared); },
                  local_options(/*deterministic=*/false));
  shared.run.events = shared.tracer->events();
  return std::move(shared.run);
}

std::vector<double> run_one_rank(const RunOptions& options) {
  const int saved_threads = tessera::num_threads();
  tessera::set_num_threads(1);
  nn::GPT model(options.model, tessera::kMeta);
  materialize(model, options);
  auto optimizer = make_optimizer(model.named_parameters(), options);
  std::vector<double> losses;
  for (int64_t step = 0; step < options.steps; ++step) {
    optimizer->zero_grad();
    double loss_sum = 0.0;
    for (int64_t index = 0; index < options.ranks; ++index) {
      const MicroBatch batch = micro_batch(options, step, index);
      const Tensor loss = model.loss(batch.inputs, batch.targets);
      tessera::autograd::backward(loss);
      loss_sum += loss.item();
    }
    // The accumulated sum becomes the mean, as the reduce-scatter's average does on N ranks.
    for (const auto& parameter : model.parameters()) {
      Tensor& tensor = parameter->tensor();
      if (tensor.grad().defined()) tensor.set_grad(ops::div(tensor.grad(), static_cast<double>(options.ranks)));
    }
    optimizer->step();
    losses.push_back(loss_sum / static_cast<double>(options.ranks));
  }
  tessera::set_num_threads(saved_threads);
  return losses;
}

}  // namespace fsdp_figures
