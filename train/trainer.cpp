// init_distributed, build_data, build_model_meta, build_optimizer, the
// optimizer step and the run.
#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <thread>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "checkpoint/rank_errors.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/state_dict.h"
#include "dist/backends/local_backend.h"
#include "dist/init.h"
#include "fsdp/float8_scales.h"
#include "dist/launch/fault_injection.h"
#include "dist/launch/launch_environment.h"
#include "train/config_json.h"
#include "train/graceful_stop.h"
#include "train/huggingface/hf_checkpoint.h"
#include "train/float8_training.h"
#include "train/lora_fine_tuning.h"
#if TESSERA_HAVE_CUDA
#include "tensor/cuda/runtime.h"
#endif
#include "nn/optim/clip_grad.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"
#include "tensor/storage.h"
#include "tp/plans.h"
#include "train/token_cache.h"

namespace tessera::train {

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
    if (config.backend != "local") {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      tessera::set_num_threads(config.threads > 0 ? config.threads : std::max(1, cores / world->local_size()));
    }
    Distributed distributed;
    distributed.world = world;
    // Each rank on a GPU of its own, by its rank on the machine (ranks as
    // threads: cuda:<rank>), as one process per GPU binds by its local rank.
    distributed.device = config.device.is_cuda() ? tessera::Device(tessera::DeviceType::cuda, world->local_rank())
                                                 : config.device;
#if TESSERA_HAVE_CUDA
    if (distributed.device.is_cuda()) tessera::cuda::set_device(distributed.device.index);
#endif
    if (config.tp == 1) {
      distributed.mesh = config.hsdp > 1
                             ? dist::DeviceMesh(world, distributed.device, {config.hsdp, config.shard_ranks()},
                                                {"replicate", "shard"})
                             : dist::DeviceMesh(world, distributed.device, {config.nproc}, {"shard"});
    } else {
      // tp innermost: ranks r*T .. r*T + T-1 form a tp group. FSDP shards over
      // the ranks that hold the same piece: those with this rank's tp index.
      const dist::DeviceMesh full(world, distributed.device, {config.hsdp, config.shard_ranks(), config.tp},
                                  {"replicate", "shard", "tp"});
      distributed.tp_mesh = full["tp"];
      std::vector<int> same_piece;
      for (int rank = static_cast<int>(full.coordinate(2)); rank < config.nproc; rank += config.tp) {
        same_piece.push_back(rank);
      }
      const dist::ProcessGroupPtr data_parallel = world->split(same_piece, "data_parallel");
      distributed.mesh = config.hsdp > 1 ? dist::DeviceMesh(data_parallel, distributed.device,
                                                            {config.hsdp, config.shard_ranks()}, {"replicate", "shard"})
                                         : dist::DeviceMesh(data_parallel, distributed.device,
                                                            {config.shard_ranks()}, {"shard"});
    }
    if (!config.trace.empty()) distributed.tracer = std::make_shared<dist::Tracer>();
    run_rank(distributed);
  };
  dist::InitOptions options;
  options.local_ranks = config.nproc;
  options.local.threads_per_rank = config.threads;  // 0: the cores shared out among the ranks
  options.local.group.deterministic = options.local.group.deterministic || config.deterministic;
  if (config.backend == "local") return dist::run_local(config.nproc, start_rank, options.local);
  if (config.backend == "nccl") {
    options.nccl = true;
    return dist::init(options, start_rank);
  }
  const dist::Launcher launcher = dist::detect_launch().launcher;
  TESSERA_CHECK(launcher == dist::Launcher::mpirun || launcher == dist::Launcher::slurm,
                "init_distributed: --backend mpi, but no mpirun or srun started this process");
  dist::init(options, start_rank);
}

namespace {

// The run's tokens: the text of --data (or the default corpus) through the
// tokenizer when there is one, else as the data loader reads files.
TokenData load_tokens(const TrainConfig& config) {
  if (config.tokenizer.empty()) return config.data.empty() ? load_default_corpus() : load_token_file(config.data);
  Tokenizer tokenizer = Tokenizer::load(config.tokenizer);
  const int64_t vocab = vocab_size(config.model_config());
  TESSERA_CHECK(vocab == tokenizer.vocab_size(),
                "data: the model's vocab is {}, but --tokenizer {} has {} ids; the tokenizer sets the vocab (leave "
                "--vocab out)",
                vocab, config.tokenizer, tokenizer.vocab_size());
  return tokenize_corpus(config.data.empty() ? read_default_corpus() : read_text_file(config.data), tokenizer,
                         config.ckpt_dir);
}

}  // namespace

DataLoader build_data(const TrainConfig& config) {
  const LoaderOptions options{.batch = config.batch, .seq_len = config.seq_len, .seed = config.seed};
  const int64_t vocab = vocab_size(config.model_config());
  DataLoader loader = config.data == kSyntheticData ? DataLoader::synthetic(vocab, options)
                                                    : DataLoader(load_tokens(config), options);
  TESSERA_CHECK(loader.token_range() <= vocab,
                "data: {} holds tokens up to {}, but the model's vocab is {}; pass --vocab {} or more",
                loader.description(), loader.token_range() - 1, vocab, loader.token_range());
  return loader;
}

std::unique_ptr<tessera::nn::CausalLM> shard_model_meta(const TrainConfig& config,
                                                        const std::optional<Distributed>& distributed) {
  std::unique_ptr<tessera::nn::CausalLM> model = build_model(config.model_config(), tessera::kMeta);
  prepare_fine_tuning(*model, config);  // adapters and NF4 before any sharding lays the parameters out
  prepare_float8(*model, config);
  // Tensor parallelism first, then FSDP over each piece (torchtitan's order).
  if (distributed && distributed->tp_mesh) {
    tessera::tp::parallelize_causal_lm(*model, *distributed->tp_mesh, {.async_chunks = config.async_tp});
  }
  tessera::nn::apply_activation_checkpointing(model->blocks(), config.ac);
  if (distributed) {
    for (const auto& block : model->blocks()) {
      fsdp::fully_shard(*block, fully_shard_options(config, /*root=*/false, distributed->mesh));
    }
    fsdp::fully_shard(*model, fully_shard_options(config, /*root=*/true, distributed->mesh));
  }
  return model;
}

std::unique_ptr<tessera::nn::CausalLM> build_model_meta(const TrainConfig& config,
                                                        const std::optional<Distributed>& distributed) {
  std::unique_ptr<tessera::nn::CausalLM> model = shard_model_meta(config, distributed);
  model->to_empty(config.device);
  model->reset_parameters(config.seed);
  return model;
}

std::unique_ptr<tessera::optim::AdamW> build_optimizer(tessera::nn::CausalLM& model, const TrainConfig& config) {
  // Frozen parameters (fine-tuning's base) get no optimizer state.
  std::vector<tessera::nn::NamedParameter> trainable;
  for (auto& named : model.named_parameters()) {
    if (named.second->requires_grad()) trainable.push_back(std::move(named));
  }
  auto groups = tessera::optim::weight_decay_groups(std::move(trainable), config.weight_decay);
  return std::make_unique<tessera::optim::AdamW>(std::move(groups),
                                                 tessera::optim::AdamWOptions{.lr = config.lr,
                                                                              .beta1 = 0.9,
                                                                              .beta2 = 0.95,
                                                                              .eps = 1e-8,
                                                                              .weight_decay = config.weight_decay});
}

// ---- the trainer -------------------------------------------------------------------------------

namespace {

// The world and the mesh's groups, each once.
std::vector<dist::ProcessGroupPtr> communication_groups(const Distributed& distributed) {
  std::vector<dist::ProcessGroupPtr> groups;
  auto add = [&groups](const dist::ProcessGroupPtr& group) {
    if (group != nullptr && std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
  };
  add(distributed.world);
  add(distributed.mesh.group());
  for (int64_t dim = 0; dim < distributed.mesh.ndim(); ++dim) add(distributed.mesh.group(dim));
  if (distributed.tp_mesh) add(distributed.tp_mesh->group(0));
  return groups;
}

int64_t bytes_sent(const std::vector<dist::ProcessGroupPtr>& groups) {
  int64_t sent = 0;
  for (const auto& group : groups) sent += group->stats().total().bytes_sent;
  return sent;
}

}  // namespace

namespace {

// The config as this rank runs it: on its own device.
TrainConfig on_rank_device(TrainConfig config, const std::optional<Distributed>& distributed) {
  if (distributed) config.device = distributed->device;
  return config;
}

}  // namespace

Trainer::Trainer(TrainConfig config, DataLoader data, std::optional<Distributed> distributed)
    : config_(on_rank_device(std::move(config), distributed)),
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
  if (fsdp_root_ && config_.cpu_offload && config_.overlap_offloaded_step) {
    overlapped_step_ = std::make_unique<tessera::fsdp::OffloadedOptimizerStep>(*model_, *optimizer_);
  }
  if (!distributed_) return;
  process_groups_ = communication_groups(*distributed_);
  for (const auto& group : process_groups_) group->set_tracer(distributed_->tracer);
}

void Trainer::settle_optimizer_step() {
  if (overlapped_step_) overlapped_step_->wait();
}

double Trainer::sum_over_ranks(double value) const {
  if (!distributed_) return value;
  Tensor total = tessera::ops::scalar_tensor(value, {.dtype = tessera::DType::f64});
  distributed_->world->all_reduce(total, dist::ReduceOp::sum);
  return total.item();
}

StepMetrics Trainer::train_step() {
  TESSERA_CHECK(!interrupted_,
                "Trainer::train_step: step {} was cut short by a stop request and its micro-batches' gradients are "
                "still accumulated; save the trainer and resume in a new one",
                step_ + 1);
  dist::TraceSpan step_span(tracer(), rank(), "compute", fmt::format("step {}", step_ + 1), "train");
  if (fsdp_root_) fsdp_root_->reset_communication_stats();
  if (distributed_ && distributed_->tp_mesh) distributed_->tp_mesh->group(0)->reset_stats();
  dist::reset_rank_peak_memory();
  if (!config_.device.is_cpu()) tessera::reset_peak_memory(config_.device);
  const auto start = std::chrono::steady_clock::now();
  const double lr = schedule_.lr(step_);
  // An overlapped optimizer step clears each group's gradients itself, and
  // may still be stepping the last groups: the lr is set once it is done.
  if (!overlapped_step_) optimizer_->zero_grad();
  refresh_float8_scales();

  const int64_t micro_batches = config_.grad_accum;
  const int64_t ranks = world_size();
  // The ranks of a tp group read the same micro-batches.
  const int64_t data_ranks = distributed_ ? distributed_->data_ranks() : 1;
  const int64_t data_rank = distributed_ ? distributed_->data_rank() : 0;
  // The micro-batches' losses stay where they were computed until all are
  // done: on cuda, reading one is a device-to-host synchronisation, and the
  // step makes one (the losses and the gradient norm, for the log).
  std::vector<Tensor> losses;
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    // FSDP2's accumulation: gradients stay unsharded on this rank until the
    // last micro-batch, whose backward reduce-scatters their sum; or every
    // micro-batch reduce-scatters its own into the sharded gradients.
    if (fsdp_root_) {
      fsdp_root_->set_requires_gradient_sync(micro + 1 == micro_batches ||
                                             config_.grad_sync == tessera::fsdp::GradientSync::every_micro_batch);
    }
    const int64_t micro_batch = next_micro_batch_ + micro * data_ranks + data_rank;
    if (const std::optional<dist::Fault> fault = dist::fault_at(dist::FaultPoint::data, rank())) {
      tessera::fail("data: reading micro-batch {} of {} failed: {} (injected fault {})", micro_batch,
                    data_.description(), dist::describe_errno(fault->error_number), fault->to_string());
    }
    Batch batch = data_.train_batch(micro_batch);
    Tensor loss = model_->loss(tessera::ops::to(batch.inputs, config_.device),
                               tessera::ops::to(batch.targets, config_.device));
    tessera::autograd::backward(loss);
    losses.push_back(loss.detach());
    // A stop request ends the step between micro-batches (the same one on
    // every rank), so a stop takes effect within one micro-batch however
    // long the step: the step is dropped whole and redone by a resume.
    if (micro + 1 < micro_batches) {
      if (const int signal = agreed_stop_request()) {
        interrupted_ = true;
        StepMetrics metrics;
        metrics.step = step_;
        metrics.stop_signal = signal;
        metrics.interrupted_after_micro_batches = micro + 1;
        return metrics;
      }
    }
  }
  // FSDP counts its own collectives, whatever the group; its last one is done
  // (the backward's final callback waited for it). Tensor parallelism's
  // activation collectives are the rest of the tp group's so far (FSDP's sums
  // of partial gradients ran on it too). From here on the groups count the
  // trainer's own: clip_grad_norm_'s and the loss's all-reduces.
  int64_t tensor_parallel_bytes = 0;
  if (distributed_ && distributed_->tp_mesh) {
    tensor_parallel_bytes = distributed_->tp_mesh->group(0)->stats().total().bytes_sent;
    if (fsdp_root_) tensor_parallel_bytes -= fsdp_root_->tensor_parallel_communication_stats().total().bytes_sent;
  }
  for (const auto& group : process_groups_) group->reset_stats();

  double grad_norm = 0.0, mean_loss = 0.0;
  {
    dist::TraceSpan span(tracer(), rank(), "compute", "optimizer", "train");
    settle_optimizer_step();  // the previous step's, long done: this step's forward waited for every group
    optimizer_->set_lr(lr);
    // The sum over micro-batches becomes their mean (the reduce-scatter has
    // already averaged over ranks).
    if (micro_batches > 1) {
      for (const auto& parameter : parameters_) {
        Tensor grad = parameter->grad();
        if (grad.defined()) tessera::ops::mul_(grad, 1.0 / static_cast<double>(micro_batches));
      }
    }
    const double max_norm = config_.clip > 0.0 ? config_.clip : std::numeric_limits<double>::infinity();
    const Tensor norm = tessera::optim::clip_grad_norm_tensor(parameters_, max_norm);  // global: the same on every rank

    // The step's one read of the device: the micro-batches' losses and the norm, together.
    std::vector<Tensor> readout;
    for (const Tensor& loss : losses) readout.push_back(tessera::ops::to(loss, tessera::DType::f64));
    readout.push_back(tessera::ops::to(norm, config_.device));
    const std::vector<double> values = tessera::ops::stack(readout, 0).to_vector<double>();
    double loss_sum = 0.0;
    for (int64_t micro = 0; micro < micro_batches; ++micro) loss_sum += values[static_cast<size_t>(micro)];
    grad_norm = values.back();

    // Every rank's losses, summed before the optimizer touches the parameters:
    // a non-finite loss stops the run on every rank at the same step.
    mean_loss = sum_over_ranks(loss_sum) / static_cast<double>(micro_batches * ranks);
    TESSERA_CHECK(std::isfinite(mean_loss), "train: step {}: the loss is {}; the model has diverged (lower --lr?)",
                  step_ + 1, mean_loss);
    TESSERA_CHECK(std::isfinite(grad_norm), "train: step {}: the gradient norm is {} (loss {}); lower --lr?",
                  step_ + 1, grad_norm, mean_loss);
    if (overlapped_step_) {
      overlapped_step_->start();  // returns at once; the next forward overlaps it
    } else {
      optimizer_->step();
    }
  }
  ++step_;
  next_micro_batch_ += micro_batches * data_ranks;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Read before the metric reduction below, so they count the step's own
  // traffic. The stop request rides along, so every rank stops after the
  // same step however the signal reached the ranks.
  int64_t comm_bytes = bytes_sent(process_groups_) + tensor_parallel_bytes;
  if (fsdp_root_) comm_bytes += fsdp_root_->communication_stats().total().bytes_sent;
  int64_t peak_bytes =
      config_.device.is_cpu() ? dist::rank_memory_stats().peak_bytes : tessera::memory_stats(config_.device).peak_bytes;
  int64_t stop_signal = GracefulStop::requested();
  if (distributed_) {
    Tensor largest = tessera::ops::from_vector(std::vector<int64_t>{peak_bytes, comm_bytes, stop_signal}, {3});
    distributed_->world->all_reduce(largest, dist::ReduceOp::max);
    const std::vector<int64_t> values = largest.to_vector<int64_t>();
    peak_bytes = values[0];
    comm_bytes = values[1];
    stop_signal = values[2];
  }

  const double tokens = static_cast<double>(config_.tokens_per_step());
  StepMetrics metrics;
  metrics.step = step_;
  metrics.loss = mean_loss;
  metrics.lr = lr;
  metrics.grad_norm = grad_norm;
  metrics.step_ms = seconds * 1e3;
  metrics.tokens_per_s = tokens / seconds;
  metrics.gflops_per_s = flops_per_token(config_.model_config(), config_.seq_len) * tokens / seconds / 1e9;
  metrics.peak_mem_bytes = peak_bytes;
  metrics.peak_rss_bytes = process_peak_rss_bytes();
  metrics.comm_bytes = comm_bytes;
  metrics.stop_signal = static_cast<int>(stop_signal);
  return metrics;
}

int Trainer::agreed_stop_request() const {
  int64_t signal = GracefulStop::requested();
  if (!distributed_) return static_cast<int>(signal);
  Tensor largest = tessera::ops::from_vector(std::vector<int64_t>{signal}, {1});
  distributed_->world->all_reduce(largest, dist::ReduceOp::max);
  return static_cast<int>(largest.to_vector<int64_t>()[0]);
}

// The weights changed since the last forward (a step, a load): their float8
// scales are taken again, for every weight in one all-reduce.
void Trainer::refresh_float8_scales() {
  if (config_.float8) fsdp::precompute_float8_scales(*model_);
}

double Trainer::evaluate() {
  settle_optimizer_step();
  refresh_float8_scales();
  dist::TraceSpan span(tracer(), rank(), "compute", "evaluate", "train");
  tessera::autograd::NoGradGuard no_grad;
  model_->eval();
  double loss_sum = 0.0;
  for (int64_t index = 0; index < config_.eval_batches; ++index) {
    Batch batch = data_.val_batch(index);
    loss_sum += model_->loss(tessera::ops::to(batch.inputs, config_.device),
                             tessera::ops::to(batch.targets, config_.device))
                    .item();
  }
  model_->train();
  return sum_over_ranks(loss_sum) / static_cast<double>(config_.eval_batches * world_size());
}

// ---- checkpoints --------------------------------------------------------------------------------

tessera::checkpoint::DistributedStateDict Trainer::state_dict() {
  settle_optimizer_step();
  return tessera::checkpoint::training_state_dict(*model_, *optimizer_);
}

namespace {

// x * 0 is 0 for every finite x and NaN for an infinity or a NaN, so the sum
// is NaN exactly when some element is not finite (a plain sum could overflow
// to inf on finite values). Computed where the tensor lives, as f64.
Tensor non_finite_witness(const Tensor& tensor) {
  return tessera::ops::to(tessera::ops::sum(tessera::ops::mul(tensor, 0.0)), tessera::DType::f64);
}

// A saved model of another family is refused by name, before its shape is
// compared: the flag to change is --model. `holder` names what was read.
void check_same_family(const nlohmann::json& saved_model, const ModelConfig& mine, const std::string& holder) {
  const ModelFamily saved = model_family_from_json(saved_model, holder);
  const ModelFamily ours = family_of(mine);
  TESSERA_CHECK(saved == ours,
                "{} holds a {} model, this run trains a {} (--model {}); pass --model {} with the shape flags it was "
                "trained with",
                holder, family_name(saved), family_name(ours), family_name(ours), family_name(saved));
}

}  // namespace

void Trainer::require_finite_state() {
  settle_optimizer_step();
  // One read per device for the whole state (on cuda a read is a
  // synchronisation), not one per tensor.
  std::map<std::string, std::pair<std::vector<std::string>, std::vector<Tensor>>> witnesses;  // by device
  for (const auto& [name, entry] : state_dict()) {
    for (const tessera::checkpoint::LocalBox& box : tessera::checkpoint::local_boxes_of(entry)) {
      const Tensor& local = box.local;
      if (local.numel() == 0 || !tessera::is_floating(local.dtype())) continue;
      auto& [names, sums] = witnesses[local.device().str()];
      names.push_back(name);
      sums.push_back(non_finite_witness(local));
    }
  }
  std::string first_bad;
  for (const auto& [device, named_sums] : witnesses) {
    const std::vector<double> sums = tessera::ops::stack(named_sums.second, 0).to_vector<double>();
    for (size_t index = 0; index < sums.size() && first_bad.empty(); ++index) {
      if (!std::isfinite(sums[index])) first_bad = named_sums.first[index];
    }
  }
  const std::vector<nlohmann::json> reports = tessera::checkpoint::gather_json(
      distributed_ ? distributed_->world : nullptr, nlohmann::json(first_bad));
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    const std::string name = reports[rank].get<std::string>();
    TESSERA_CHECK(name.empty(),
                  "train: step {}: {} holds NaN or infinite values (rank {}'s shard); nothing is saved or exported "
                  "(lower --lr?)",
                  step_, name, rank);
  }
}

nlohmann::json Trainer::training_state() const {
  const tessera::Generator& generator = tessera::default_generator();
  const nlohmann::json mine = {{"seed", generator.seed()}, {"next_stream", generator.next_stream()}};
  const nlohmann::json rng = tessera::checkpoint::gather_json(distributed_ ? distributed_->world : nullptr, mine);
  return {{"step", step_},
          {"data", {{"next_micro_batch", next_micro_batch_}, {"seed", config_.seed}, {"batch", config_.batch},
                    {"seq_len", config_.seq_len}}},
          {"schedule", {{"max_lr", schedule_.max_lr()}, {"min_lr", schedule_.min_lr()},
                        {"warmup_steps", schedule_.warmup_steps()}, {"total_steps", schedule_.total_steps()}}},
          {"rng", rng},
          {"world_size", world_size()},
          {"config",
           {{"model", model_config_to_json(config_.model_config())}, {"train", train_config_to_json(config_)}}}};
}

void Trainer::resume_from(const std::string& dir) {
  settle_optimizer_step();
  // The settings are checked before any tensor is read.
  const tessera::checkpoint::CheckpointMetadata metadata = tessera::checkpoint::read_metadata(dir);
  const nlohmann::json& state = metadata.training_state;
  try {
    const nlohmann::json saved_model = state.at("config").at("model");
    const nlohmann::json model = model_config_to_json(config_.model_config());
    check_same_family(saved_model, config_.model_config(), "the checkpoint");
    model_config_from_json(saved_model, dir);  // validates the saved shape
    TESSERA_CHECK(saved_model == model, "the checkpoint's model is {}, this run's {}; pass the same shape flags",
                  saved_model.dump(), model.dump());
    const nlohmann::json& data = state.at("data");
    TESSERA_CHECK(data.at("seed") == config_.seed && data.at("batch") == config_.batch &&
                      data.at("seq_len") == config_.seq_len,
                  "the checkpoint's data order is seed {}, batch {}, seq_len {}; this run's seed {}, batch {}, "
                  "seq_len {}; pass the same --seed, --batch and --seq-len",
                  data.at("seed").dump(), data.at("batch").dump(), data.at("seq_len").dump(), config_.seed,
                  config_.batch, config_.seq_len);
    step_ = state.at("step").get<int64_t>();
    TESSERA_CHECK(!metadata.step || *metadata.step == step_,
                  "the training state is at step {}, the checkpoint's metadata at step {}", step_, *metadata.step);
    next_micro_batch_ = data.at("next_micro_batch").get<int64_t>();
    const nlohmann::json& schedule = state.at("schedule");
    schedule_ = tessera::optim::WarmupCosineSchedule(
        schedule.at("max_lr").get<double>(), schedule.at("min_lr").get<double>(),
        schedule.at("warmup_steps").get<int64_t>(), schedule.at("total_steps").get<int64_t>());
    tessera::checkpoint::load(dir, state_dict(), {.group = distributed_ ? distributed_->world : nullptr});
    const nlohmann::json& rng = state.at("rng");
    TESSERA_CHECK(rng.is_array() && !rng.empty(), "the checkpoint's rng states are missing");
    const nlohmann::json& mine = rng.at(static_cast<size_t>(rank()) % rng.size());
    tessera::default_generator().manual_seed(mine.at("seed").get<uint64_t>());
    tessera::default_generator().set_next_stream(mine.at("next_stream").get<uint64_t>());
  } catch (const nlohmann::json::exception& error) {
    tessera::fail("resume: {}/metadata.json: the training state is incomplete: {}", dir, error.what());
  } catch (const tessera::Error& error) {
    tessera::fail("resume: {}: {}", dir, error.what());
  }
}

void Trainer::init_from(const std::string& path) {
  settle_optimizer_step();
  if (is_hf_model_dir(path)) {  // the run's model was built from its config.json (train_config.cpp)
    PretrainedWeightsTarget target(*model_);
    load_hf_weights(path, read_hf_model_info(path), target.state());
    target.quantize_loaded();
    return;
  }
  const nlohmann::json model = model_config_to_json(config_.model_config());
  const std::map<std::string, std::string> metadata = tessera::checkpoint::read_safetensors_header(path).metadata;
  const auto recorded = metadata.find(kGptConfigMetadataKey);
  std::optional<nlohmann::json> saved;
  if (recorded != metadata.end()) {
    try {
      saved = nlohmann::json::parse(recorded->second);
    } catch (const nlohmann::json::parse_error& error) {
      tessera::fail("init-from: {} __metadata__ {}: not valid JSON: {}", path, kGptConfigMetadataKey, error.what());
    }
    check_same_family(*saved, config_.model_config(), "init-from: " + path);
  }
  PretrainedWeightsTarget target(*model_);
  tessera::checkpoint::import_safetensors(path, target.state());
  target.quantize_loaded();
  TESSERA_CHECK(!saved || *saved == model, "init-from: {} holds a model {}, this run's is {}", path, saved->dump(),
                model.dump());
}

void Trainer::export_to(const std::string& path) {
  settle_optimizer_step();
  // Without --overwrite, a file that appeared at PATH during the run is never replaced (output_claim.h).
  const tessera::checkpoint::Publish publish =
      config_.overwrite ? tessera::checkpoint::Publish::replace : tessera::checkpoint::Publish::no_clobber;
  if (config_.export_format == "hf") {
    // The export carries the source directory's token ids and generation config, and the run's tokenizer.
    const HfExportSources sources{is_hf_model_dir(config_.init_from) ? config_.init_from : "", config_.tokenizer};
    export_hf(path, config_.model_config(), merged_model_state(*model_),
              {.group = distributed_ ? distributed_->world : nullptr, .publish = publish, .sources = sources});
    return;
  }
  tessera::checkpoint::export_safetensors(
      path, merged_model_state(*model_),
      {.group = distributed_ ? distributed_->world : nullptr,
       .metadata = {{kGptConfigMetadataKey, model_config_to_json(config_.model_config()).dump()},
                    {kStepMetadataKey, std::to_string(step_)}},
       .sync = true,
       .publish = publish});
}

}  // namespace tessera::train
