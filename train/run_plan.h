// `train --plan`: how the run's model shards over its mesh and what each rank
// will hold and send, printed without training and without starting a rank.
// The model is built on meta, tensor-parallelized as tp rank 0 would (on a
// planning mesh: sizes, no groups) under --tp, and the fully_shard calls
// shard_model_meta would make (each block, then the root) are planned for the
// mesh's sizes alone (fsdp::plan_fully_shard), so any --nproc, --hsdp and
// --tp plan in a moment: GPT-2 XL or Llama 3 8B over 1,024 ranks in about a
// second. The bytes of a step add tensor parallelism's collectives
// (tp::plan_traffic) and the trainer's own (the gradient norm, the loss):
// their sum is what the run logs as sent per rank, exactly. `--plan --sweep`
// adds the same figures for 1, 2, 4, ..., 1024 ranks, FSDP and HSDP, each at
// tp 1, 2, 4 and 8, as a table, a .json or .csv file (--sweep-out) and an SVG
// chart (--sweep-svg).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/comm_stats.h"
#include "fsdp/plan.h"
#include "nn/models/causal_lm.h"
#include "train/svg_chart.h"
#include "train/train_config.h"

namespace tessera::train {

// The sweep plans 1, 2, 4, ... up to this many ranks.
inline constexpr int64_t kSweepMaxRanks = 1024;
// The HSDP replicate degrees it plans besides plain FSDP (and the run's --hsdp).
inline constexpr std::array<int64_t, 2> kSweepReplicas = {2, 8};
// The tp sizes it plans each series at besides none (and the run's --tp).
inline constexpr std::array<int64_t, 3> kSweepTensorParallel = {2, 4, 8};
// What `train`'s optimizer keeps per parameter: AdamW's m and v, in the parameter's dtype.
inline const tessera::fsdp::OptimizerStateSize kAdamWState{.description = "AdamW state (m, v)", .copies = 2};

// The fully_shard calls shard_model_meta makes on `model` (the config's):
// every block with the config's reshard_after_forward and mixed precision,
// then the root with FSDP's default (kept unsharded after forward).
std::vector<tessera::fsdp::PlannedCall> fully_shard_calls(const TrainConfig& config, tessera::nn::CausalLM& model);

// The run's mesh by its sizes: --hsdp x shard x --tp over --nproc ranks.
tessera::fsdp::PlanMesh run_mesh(const TrainConfig& config);

// The config's model on meta, laid out as tp rank 0 of `tensor_parallel`
// ranks would lay it out (tp/plans.h, on a planning mesh) when that is > 1.
// Throws tessera::Error where parallelize would (a tp that does not divide
// n_head or n_kv_head, named).
std::unique_ptr<tessera::nn::CausalLM> plan_model(const TrainConfig& config, int64_t tensor_parallel);

// What a rank sends in one optimizer step (--grad-accum micro-batches), by
// who sends it.
struct StepTraffic {
  tessera::fsdp::StepCommVolume fsdp;  // FSDP's gathers and reductions (and the partial gradients' sums over tp)
  // Tensor parallelism's own: the activations' all-gathers and
  // reduce-scatters, and the vocabulary-parallel loss's all-reduces.
  tessera::dist::CommStats tensor_parallel;
  tessera::dist::CommVolume gradient_norm;  // clip_grad_norm_'s all-reduces of one f64 over each shard group
  tessera::dist::CommVolume mean_loss;      // the step's loss summed over the world (one f64)

  // What `train` logs as sent per rank for the step, and the bytes received.
  int64_t total_sent() const;
  int64_t total_received() const;
};

// A run's plan over `mesh`: FSDP's groups over tp rank 0's pieces, and the
// step's traffic.
struct RunPlan {
  tessera::fsdp::ShardingPlan sharding;
  StepTraffic traffic;
};

// The plan of `model` (plan_model's, for mesh.tensor_parallel) over `mesh`.
RunPlan plan_run(const TrainConfig& config, tessera::nn::CausalLM& model, const tessera::fsdp::PlanMesh& mesh);

// One mesh of the sweep, per rank.
struct SweepPoint {
  std::string series;  // "FSDP", "HSDP R=2" (2 replicas), "FSDP x TP 4"
  tessera::fsdp::PlanMesh mesh;
  int64_t parameter_shard_bytes = 0;
  int64_t gradient_shard_bytes = 0;
  int64_t optimizer_state_bytes = 0;  // AdamW's
  int64_t peak_unsharded_bytes = 0;
  std::string peak_moment;  // fsdp::UnshardedPeak::moment
  StepTraffic traffic;      // one optimizer step of --grad-accum micro-batches

  int64_t memory_bytes() const {
    return parameter_shard_bytes + gradient_shard_bytes + optimizer_state_bytes + peak_unsharded_bytes;
  }
};

struct Sweep {
  std::vector<SweepPoint> points;    // series by series, ranks rising
  std::vector<std::string> skipped;  // meshes the run's settings do not fit, and why
};

// The plans of FSDP over 1, 2, 4, ..., kSweepMaxRanks ranks and of HSDP: R
// replicas (each of kSweepReplicas, and the config's --hsdp) of 1, 2, 4, ...
// shard ranks; each series without tensor parallelism and at each tp of
// kSweepTensorParallel (and the config's --tp); up to kSweepMaxRanks in all.
// A mesh whose shard group --reshard-after-forward N does not divide is
// skipped, and a tp the model or --seq-len does not divide by, saying so.
Sweep sweep_plans(const TrainConfig& config, tessera::nn::CausalLM& model);

// The sweep for plotting: the run's settings and one object per point
// (bytes as integers), or one CSV row per point under a header.
nlohmann::json sweep_json(const TrainConfig& config, const Sweep& sweep);
std::string sweep_csv(const Sweep& sweep);
// Per-rank memory (solid, "memory FSDP") and bytes sent per step (dashed,
// "sent FSDP") against ranks, one pair of lines per series, both axes logarithmic; a point with no bytes
// (one rank sends nothing) is left out.
charts::LineChart sweep_chart(const TrainConfig& config, const Sweep& sweep);

// Throws tessera::Error when --sweep-out and --sweep-svg name one file (or
// standard output's), or, without --overwrite, a file an earlier launch left.
void check_plan_outputs(const TrainConfig& config);

// Prints the plan of the config's run over its mesh (--nproc, --hsdp) to
// `out`: the run's settings (describe), fsdp::format_plan with AdamW's
// state, and what a plan leaves out (activations and gradients in flight,
// from estimate_rank_memory); with config.sweep, the sweep's table and its
// files. Under mpirun or srun only world rank 0 prints and writes.
void print_plan(const TrainConfig& config, std::ostream& out);

}  // namespace tessera::train
