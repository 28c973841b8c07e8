// The trainer's loop, in the order the FSDP2 recipe reads:
//   init_distributed   the ranks (local threads or the MPI world) and the mesh;
//   build_model_meta   the model (a GPT or a Llama: any nn::CausalLM) on meta,
//                      fully_shard each block, then the root,
//                      to_empty(cpu), reset_parameters(seed): every rank fills
//                      only its own rows, no rank ever holds the whole model;
//   build_optimizer    AdamW on the shards;
//   train_step         micro-batches (gradients synced on the last), gradient
//                      mean, global-norm clipping, warmup + cosine lr, AdamW;
//   evaluate           every rank the same validation batches.
// A Trainer built without a Distributed trains the plain, unsharded model on
// the calling thread (benchmarks and tests use that); `train` (training_run.h) always runs
// FSDP, over one rank too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/sharded_checkpoint.h"
#include "dist/device_mesh.h"
#include "dist/trace.h"
#include "fsdp/fully_shard.h"
#include "fsdp/offloaded_optimizer_step.h"
#include "nn/models/causal_lm.h"
#include "nn/optim/adamw.h"
#include "nn/optim/schedule.h"
#include "train/data_loader.h"
#include "train/metrics.h"
#include "train/train_config.h"

namespace tessera::train {

// One rank's view of the job.
struct Distributed {
  tessera::dist::ProcessGroupPtr world;
  // This rank's device: --device cpu, or its own GPU, cuda:<local rank>.
  tessera::Device device;
  // FSDP's mesh: ("shard") or ("replicate", "shard") with --hsdp, over the
  // ranks that hold the same tensor-parallel piece.
  tessera::dist::DeviceMesh mesh;
  // With --tp: the ("tp") mesh of this rank's tp group, which splits the model.
  std::optional<tessera::dist::DeviceMesh> tp_mesh;
  std::shared_ptr<tessera::dist::Tracer> tracer;  // null without --trace

  int rank() const { return world->rank(); }
  int size() const { return world->size(); }
  // Which batches this rank reads: its tp group's index (the world rank
  // without --tp), of data_ranks().
  int64_t data_rank() const { return tp_mesh ? rank() / tp_mesh->size() : rank(); }
  int64_t data_ranks() const { return tp_mesh ? size() / tp_mesh->size() : size(); }
};

// Starts the ranks the config asks for (--nproc threads, or this process's
// rank of the mpirun/srun world with --backend mpi), builds the mesh, and
// runs `run_rank` on every rank. Rethrows the first rank's error.
void init_distributed(const TrainConfig& config, const std::function<void(const Distributed&)>& run_rank);

// The data the config names: "" = the default corpus, "synthetic" = tokens
// below the model's vocab, else a text or llm.c token file. Throws
// tessera::Error when the model's vocab is too small for the data's tokens.
DataLoader build_data(const TrainConfig& config);

// The config's model built on meta; with `distributed`, fully_shard each
// block (the config's reshard_after_forward and mixed precision) and then the
// root. Nothing is allocated: every parameter is a meta shard with its
// sharding spec, what `train --plan` reads for a model too large to hold.
std::unique_ptr<tessera::nn::CausalLM> shard_model_meta(const TrainConfig& config,
                                                        const std::optional<Distributed>& distributed);

// shard_model_meta, then allocated on the CPU and initialised from
// config.seed: the bits depend only on the seed and each parameter's name,
// whatever the world size.
std::unique_ptr<tessera::nn::CausalLM> build_model_meta(const TrainConfig& config,
                                                        const std::optional<Distributed>& distributed);

// AdamW with two groups (optim::weight_decay_groups): dim >= 2 tensors (matmul
// and embedding weights, GPT-2's convention) decay; biases and norm weights do
// not. Built after sharding, it steps this rank's shards.
std::unique_ptr<tessera::optim::AdamW> build_optimizer(tessera::nn::CausalLM& model, const TrainConfig& config);

class Trainer {
 public:
  Trainer(TrainConfig config, DataLoader data, std::optional<Distributed> distributed = std::nullopt);

  // One optimizer step. Rank r's micro-batch a is global micro-batch a*N + r
  // of the step (N ranks), so the step sees the same sequences on any world
  // size. Each micro-batch backwards its unscaled loss (under FSDP, gradients
  // stay local until the last micro-batch's backward reduce-scatters their
  // sum, averaged over ranks); then every gradient is divided by grad_accum,
  // clipped by the global norm (unless --clip 0), and AdamW steps with the
  // schedule's lr. The metrics are the same on every rank: the loss is the
  // mean over all ranks' micro-batches, memory and bytes the largest rank's.
  // Stops with a tessera::Error naming the step when the loss or the
  // gradient norm is not finite (the same on every rank: both are global).
  // A stop request (GracefulStop) seen by any rank between two micro-batches
  // cuts the step short on every rank: nothing is updated, the metrics carry
  // the signal and interrupted_after_micro_batches, and the trainer takes no
  // further step (its checkpoint holds the last finished one).
  StepMetrics train_step();
  // Mean loss over config.eval_batches validation micro-batches, without the
  // graph (every rank runs the same batches; the ranks' means are averaged).
  double evaluate();

  // ---- checkpoints ----
  // Model and AdamW state by name ("model.<fqn>", "optim.<fqn>.<key>"),
  // viewing the live shards: what a checkpoint saves and loads in place.
  tessera::checkpoint::DistributedStateDict state_dict();
  // Everything else exact resume needs, as JSON (collective: it gathers
  // every rank's RNG state): step, data position, lr schedule, RNG states,
  // and the config (the model's, which generate reads, and the run's).
  nlohmann::json training_state() const;
  // Throws on every rank when any rank's model or AdamW state holds a NaN or
  // an infinity, naming the rank and the tensor: called before every save,
  // so no checkpoint or export ever holds a non-finite value (collective).
  void require_finite_state();
  // Loads a checkpoint saved on any world size and restores the state above.
  // The model family and shape, seed, batch and sequence length must match
  // the checkpoint's (a different data order would not be a resume), and its
  // training state's step that of its metadata; the lr schedule is the
  // checkpoint's. Same world size: RNG states per rank; a
  // different one: rank r takes saved rank r mod N.
  void resume_from(const std::string& dir);
  // Starts from the weights of an exported .safetensors file, or of a
  // Hugging Face model directory (each rank reading only its shards' bytes);
  // optimizer state stays fresh. A file that records another model family
  // is refused before any tensor is read.
  void init_from(const std::string& path);
  // Writes the model as one .safetensors file with its parameter names and
  // the model config in the file's metadata, or with export_format "hf" as a
  // Hugging Face model directory (collective). Replaces what is at PATH only
  // with --overwrite; else a file written there meanwhile is an error.
  void export_to(const std::string& path);

  int64_t steps_done() const { return step_; }
  const TrainConfig& config() const { return config_; }
  const DataLoader& data() const { return data_; }
  // Both wait for an overlapped optimizer step first (--cpu-offload).
  tessera::nn::CausalLM& model() {
    settle_optimizer_step();
    return *model_;
  }
  tessera::optim::AdamW& optimizer() {
    settle_optimizer_step();
    return *optimizer_;
  }
  const std::optional<Distributed>& distributed() const { return distributed_; }
  // The world and the mesh's groups, each once (FSDP's reshard-after-forward
  // groups trace with the mesh's shard group). comm_bytes is what they carry
  // after backward plus FSDP's own collectives (FSDPModule::communication_stats).
  const std::vector<tessera::dist::ProcessGroupPtr>& process_groups() const { return process_groups_; }

 private:
  int rank() const { return distributed_ ? distributed_->rank() : 0; }
  int world_size() const { return distributed_ ? distributed_->size() : 1; }
  tessera::dist::Tracer* tracer() const { return distributed_ ? distributed_->tracer.get() : nullptr; }
  double sum_over_ranks(double value) const;
  // The largest stop signal any rank has received (0: none); collective.
  int agreed_stop_request() const;
  // Returns once the last optimizer step has finished: under --cpu-offload
  // it runs on a host thread, overlapped with the next forward
  // (fsdp/offloaded_optimizer_step.h); rethrows its error.
  void settle_optimizer_step();
  void refresh_float8_scales();

  TrainConfig config_;
  DataLoader data_;
  std::optional<Distributed> distributed_;
  std::unique_ptr<tessera::nn::CausalLM> model_;
  std::optional<tessera::fsdp::FSDPModule> fsdp_root_;  // set under FSDP
  std::unique_ptr<tessera::optim::AdamW> optimizer_;
  tessera::optim::WarmupCosineSchedule schedule_;
  std::vector<std::shared_ptr<tessera::nn::Parameter>> parameters_;
  std::vector<tessera::dist::ProcessGroupPtr> process_groups_;
  int64_t step_ = 0;
  // Global index of the next step's first micro-batch: the data position.
  int64_t next_micro_batch_ = 0;
  bool interrupted_ = false;  // a step was cut short: its gradients are half accumulated
  // --cpu-offload under FSDP; declared last, so it is destroyed (its step
  // joined) before the optimizer and the model it steps.
  std::unique_ptr<tessera::fsdp::OffloadedOptimizerStep> overlapped_step_;
};

}  // namespace tessera::train
