// init_distributed, build_data, build_model_meta, build_optimizer, the
// optimizer step and the run.
#include "examples/gpt/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "dist/launch.h"
#include "dist/local_backend.h"
#include "fsdp/plan.h"
#include "nn/optim/clip_grad.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

namespace gpt {

using tessera::Tensor;
namespace dist = tessera::dist;
namespace fsdp = tessera::fsdp;

// ---- the recipe --------------------------------------------------------------------------------

void init_distributed(const TrainConfig& config, const std::function<void(const Distributed&)>& run_rank) {
  config.validate();
  auto start_rank = [&](const dist::ProcessGroupPtr& world) {
    TESSERA_CHECK(world->size() == config.nproc, "init_distributed: the world has {} ranks, the config {} (--nproc)",
                  world->size(), config.nproc);
    // Local ranks get their share of the cores from run_local; MPI ranks on
    // one machine share them out here, or OpenMP teams would oversubscribe it.
    if (config.backend == "mpi") {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      tessera::set_num_threads(config.threads > 0 ? config.threads : std::max(1, cores / world->local_size()));
    }
    Distributed distributed;
    distributed.world = world;
    distributed.mesh = config.hsdp > 1
                           ? dist::DeviceMesh(world, tessera::kCPU, {config.hsdp, config.shard_ranks()},
                                              {"replicate", "shard"})
                           : dist::DeviceMesh(world, tessera::kCPU, {config.nproc}, {"shard"});
    if (!config.trace.empty()) distributed.tracer = std::make_shared<dist::Tracer>();
    run_rank(distributed);
  };
  dist::InitOptions options;
  options.local_ranks = config.nproc;
  options.local.threads_per_rank = config.threads;  // 0: the cores shared out among the ranks
  options.local.group.deterministic = options.local.group.deterministic || config.deterministic;
  if (config.backend == "local") return dist::run_local(config.nproc, start_rank, options.local);
  const dist::Launcher launcher = dist::detect_launch().launcher;
  TESSERA_CHECK(launcher == dist::Launcher::mpirun || launcher == dist::Launcher::slurm,
                "init_distributed: --backend mpi, but no mpirun or srun started this process");
  dist::init(options, start_rank);
}

DataLoader build_data(const TrainConfig& config) {
  const LoaderOptions options{.batch = config.batch, .seq_len = config.seq_len, .seed = config.seed};
  DataLoader loader = config.data == kSyntheticData
                          ? DataLoader::synthetic(config.model.vocab_size, options)
                          : DataLoader(config.data.empty() ? load_default_corpus() : load_token_file(config.data),
                                       options);
  TESSERA_CHECK(loader.token_range() <= config.model.vocab_size,
                "data: {} holds tokens up to {}, but the model's vocab is {}; pass --vocab {} or more",
                loader.description(), loader.token_range() - 1, config.model.vocab_size, loader.token_range());
  return loader;
}

std::unique_ptr<tessera::nn::GPT> build_model_meta(const TrainConfig& config,
                                                   const std::optional<Distributed>& distributed) {
  auto model = std::make_unique<tessera::nn::GPT>(config.model, tessera::kMeta);
  if (distributed) {
    const fsdp::MixedPrecisionPolicy policy{.param_dtype = config.param_dtype,
                                            .reduce_dtype = config.reduce_dtype,
                                            .output_dtype = std::nullopt,
                                            .cast_forward_inputs = true};
    for (const auto& block : model->blocks()) {
      fsdp::fully_shard(*block, {.mesh = distributed->mesh,
                                 .reshard_after_forward = config.reshard_after_forward,
                                 .mp_policy = policy,
                                 .ignored_params = {}});
    }
    // The root (embeddings, tied head, final norm) keeps FSDP's default for
    // roots: not resharded after forward, as backward needs it first.
    fsdp::fully_shard(*model, {.mesh = distributed->mesh,
                               .reshard_after_forward = std::nullopt,
                               .mp_policy = policy,
                               .ignored_params = {}});
  }
  model->to_empty(tessera::kCPU);
  model->reset_parameters(config.seed);
  return model;
}

std::unique_ptr<tessera::optim::AdamW> build_optimizer(tessera::nn::GPT& model, const TrainConfig& config) {
  auto groups = tessera::optim::weight_decay_groups(model.named_parameters(), config.weight_decay);
  return std::make_unique<tessera::optim::AdamW>(std::move(groups),
                                                 tessera::optim::AdamWOptions{.lr = config.lr,
                                                                              .beta1 = 0.9,
                                                                              .beta2 = 0.95,
                                                                              .eps = 1e-8,
                                                                              .weight_decay = config.weight_decay});
}

// ---- the trainer -------------------------------------------------------------------------------

namespace {

// The world, the mesh's groups and FSDP's groups, each once.
std::vector<dist::ProcessGroupPtr> communication_groups(const Distributed& distributed, tessera::nn::GPT& model) {
  std::vector<dist::ProcessGroupPtr> groups;
  auto add = [&groups](const dist::ProcessGroupPtr& group) {
    if (group != nullptr && std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
  };
  add(distributed.world);
  add(distributed.mesh.group());
  for (int64_t dim = 0; dim < distributed.mesh.ndim(); ++dim) add(distributed.mesh.group(dim));
  for (tessera::nn::Module* module : model.modules()) {
    const fsdp::FSDPState* state = module->extension<fsdp::FSDPState>();
    if (state == nullptr || state->group() == nullptr) continue;
    const fsdp::GroupComm& comm = state->group()->comm();
    add(comm.shard);
    add(comm.replicate);
    add(comm.post_forward);
  }
  return groups;
}

int64_t bytes_sent(const std::vector<dist::ProcessGroupPtr>& groups) {
  int64_t sent = 0;
  for (const auto& group : groups) sent += group->stats().total().bytes_sent;
  return sent;
}

}  // namespace

Trainer::Trainer(TrainConfig config, DataLoader data, std::optional<Distributed> distributed)
    : config_(std::move(config)),
      data_(std::move(data)),
      distributed_(std::move(distributed)),
      model_(build_model_meta(config_, distributed_)),
      fsdp_root_(fsdp::fsdp_module(*model_)),
      optimizer_(build_optimizer(*model_, config_)),
      schedule_(config_.lr, config_.lr * config_.min_lr_ratio, config_.warmup, config_.steps),
      parameters_(model_->parameters()) {
  TESSERA_CHECK(data_.options().batch == config_.batch && data_.options().seq_len == config_.seq_len,
                "Trainer: the data loader yields [{}, {}] batches, the config asks for [{}, {}]", data_.options().batch,
                data_.options().seq_len, config_.batch, config_.seq_len);
  TESSERA_CHECK(world_size() == config_.nproc, "Trainer: the config says {} ranks (--nproc) but the world has {}",
                config_.nproc, world_size());
  if (!distributed_) return;
  process_groups_ = communication_groups(*distributed_, *model_);
  for (const auto& group : process_groups_) group->set_tracer(distributed_->tracer);
}

double Trainer::sum_over_ranks(double value) const {
  if (!distributed_) return value;
  Tensor total = tessera::ops::scalar_tensor(value, {.dtype = tessera::DType::f64});
  distributed_->world->all_reduce(total, dist::ReduceOp::sum);
  return total.item();
}

StepMetrics Trainer::train_step() {
  dist::TraceSpan step_span(tracer(), rank(), "compute", fmt::format("step {}", step_ + 1), "train");
  for (const auto& group : process_groups_) group->reset_stats();
  dist::reset_rank_peak_memory();
  const auto start = std::chrono::steady_clock::now();
  const double lr = schedule_.lr(step_);
  optimizer_->set_lr(lr);
  optimizer_->zero_grad();

  const int64_t micro_batches = config_.grad_accum;
  const int64_t ranks = world_size();
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    // FSDP2's accumulation: gradients stay unsharded on this rank until the
    // last micro-batch, whose backward reduce-scatters their sum.
    if (fsdp_root_) fsdp_root_->set_requires_gradient_sync(micro + 1 == micro_batches);
    Batch batch = data_.train_batch(global_micro_batch(step_, micro_batches * ranks, micro * ranks + rank()));
    Tensor loss = model_->loss(batch.inputs, batch.targets);
    loss_sum += loss.item();
    tessera::autograd::backward(loss);
  }

  double grad_norm = 0.0;
  {
    dist::TraceSpan span(tracer(), rank(), "compute", "optimizer", "train");
    // The sum over micro-batches becomes their mean (the reduce-scatter has
    // already averaged over ranks).
    if (micro_batches > 1) {
      for (const auto& parameter : parameters_) {
        Tensor grad = parameter->grad();
        if (grad.defined()) tessera::ops::mul_(grad, 1.0 / static_cast<double>(micro_batches));
      }
    }
    const double max_norm = config_.clip > 0.0 ? config_.clip : std::numeric_limits<double>::infinity();
    grad_norm = tessera::optim::clip_grad_norm_(parameters_, max_norm);  // global: the same on every rank
    TESSERA_CHECK(std::isfinite(grad_norm), "train: the gradient norm is {} at step {} (loss {}); try a lower --lr",
                  grad_norm, step_ + 1, loss_sum / static_cast<double>(micro_batches));
    optimizer_->step();
  }
  ++step_;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Read before the metric reductions below, so they count the step's own traffic.
  int64_t comm_bytes = bytes_sent(process_groups_);
  int64_t peak_bytes = dist::rank_memory_stats().peak_bytes;
  loss_sum = sum_over_ranks(loss_sum);
  if (distributed_) {
    Tensor largest = tessera::ops::from_vector(std::vector<int64_t>{peak_bytes, comm_bytes}, {2});
    distributed_->world->all_reduce(largest, dist::ReduceOp::max);
    const std::vector<int64_t> values = largest.to_vector<int64_t>();
    peak_bytes = values[0];
    comm_bytes = values[1];
  }

  const double tokens = static_cast<double>(config_.tokens_per_step());
  StepMetrics metrics;
  metrics.step = step_;
  metrics.loss = loss_sum / static_cast<double>(micro_batches * ranks);
  metrics.lr = lr;
  metrics.grad_norm = grad_norm;
  metrics.step_ms = seconds * 1e3;
  metrics.tokens_per_s = tokens / seconds;
  metrics.gflops_per_s = config_.model.flops_per_token(config_.seq_len) * tokens / seconds / 1e9;
  metrics.peak_mem_bytes = peak_bytes;
  metrics.peak_rss_bytes = process_peak_rss_bytes();
  metrics.comm_bytes = comm_bytes;
  return metrics;
}

double Trainer::evaluate() {
  dist::TraceSpan span(tracer(), rank(), "compute", "evaluate", "train");
  tessera::autograd::NoGradGuard no_grad;
  model_->eval();
  double loss_sum = 0.0;
  for (int64_t index = 0; index < config_.eval_batches; ++index) {
    Batch batch = data_.val_batch(index);
    loss_sum += model_->loss(batch.inputs, batch.targets).item();
  }
  model_->train();
  return sum_over_ranks(loss_sum) / static_cast<double>(config_.eval_batches * world_size());
}

// ---- the run -------------------------------------------------------------------------------------

namespace {

void print_setup(const TrainConfig& config, const DataLoader& data, std::ostream& out) {
  out << describe(config) << '\n';
  out << fmt::format("data     {}\n         {} training and {} validation tokens\n", data.description(),
                     data.is_synthetic() ? std::string("unbounded") : std::to_string(data.train_tokens()),
                     data.is_synthetic() ? std::string("unbounded") : std::to_string(data.val_tokens()));
  out << fmt::format("threads  {} per rank\n", tessera::num_threads());
  out << fmt::format("target   unigram entropy of the training data {:.4f} nats (a model that ignores context); "
                     "uniform guess ln({}) = {:.4f}\n",
                     data.unigram_entropy(), config.model.vocab_size,
                     std::log(static_cast<double>(config.model.vocab_size)));
  out.flush();
}

}  // namespace

TrainSummary train(const TrainConfig& config, std::ostream& out) {
  config.validate();
  const DataLoader data = build_data(config);
  TrainSummary summary;
  summary.unigram_entropy = data.unigram_entropy();

  init_distributed(config, [&](const Distributed& distributed) {
    const bool leader = distributed.rank() == 0;
    std::optional<JsonLinesWriter> log;
    if (leader && !config.log_json.empty() && !config.plan) log.emplace(config.log_json);
    if (leader) print_setup(config, data, out);

    Trainer trainer(config, data, distributed);
    if (config.plan) {
      if (leader) out << '\n' << fsdp::sharding_plan(trainer.model());
      return;
    }

    const auto start = std::chrono::steady_clock::now();
    for (int64_t step = 1; step <= config.steps; ++step) {
      StepMetrics metrics = trainer.train_step();
      const bool eval_due = config.eval_every > 0 && (step % config.eval_every == 0 || step == config.steps);
      if (eval_due) metrics.val_loss = trainer.evaluate();
      if (!leader) continue;
      if (metrics.val_loss) summary.val_loss = metrics.val_loss;
      summary.losses.push_back(metrics.loss);
      out << format_progress(metrics) << '\n';
      out.flush();
      if (log) log->write(to_json(metrics));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    if (distributed.tracer) dist::write_chrome_trace(*distributed.tracer, *distributed.world, config.trace);
    if (!leader) return;
    summary.seconds = seconds;
    out << fmt::format("done     {} steps in {:.1f} s: loss {:.4f} -> {:.4f}{}; unigram entropy {:.4f} nats\n",
                       config.steps, summary.seconds, summary.losses.front(), summary.losses.back(),
                       summary.val_loss ? fmt::format(" (val {:.4f})", *summary.val_loss) : std::string(),
                       summary.unigram_entropy);
    if (distributed.tracer) out << fmt::format("trace    {} (open in ui.perfetto.dev)\n", config.trace);
  });
  return summary;
}

}  // namespace gpt
