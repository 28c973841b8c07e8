// `train --plan`: how the run's model shards over its mesh and what each rank
// will hold and send, printed without training and without starting a rank.
// The model is built on meta and the fully_shard calls shard_model_meta would
// make (each block, then the root) are planned for the mesh's sizes alone
// (fsdp::plan_fully_shard), so any --nproc and --hsdp plan in a moment: GPT-2
// XL or Llama 3 8B over 1,024 ranks in about a second. `--plan --sweep` adds
// the same figures for 1, 2, 4, ..., 1024 ranks, FSDP and HSDP, as a table,
// a .json or .csv file (--sweep-out) and an SVG chart (--sweep-svg).
#pragma once

#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/plan.h"
#include "nn/models/causal_lm.h"
#include "train/svg_chart.h"
#include "train/train_config.h"

namespace tessera::train {

// The sweep plans 1, 2, 4, ... up to this many ranks.
inline constexpr int64_t kSweepMaxRanks = 1024;
// The HSDP replicate degrees it plans besides plain FSDP (and the run's --hsdp).
inline constexpr std::array<int64_t, 2> kSweepReplicas = {2, 8};
// What `train`'s optimizer keeps per parameter: AdamW's m and v, in the parameter's dtype.
inline const tessera::fsdp::OptimizerStateSize kAdamWState{.description = "AdamW state (m, v)", .copies = 2};

// The fully_shard calls shard_model_meta makes on `model` (the config's):
// every block with the config's reshard_after_forward and mixed precision,
// then the root with FSDP's default (kept unsharded after forward).
std::vector<tessera::fsdp::PlannedCall> fully_shard_calls(const TrainConfig& config, tessera::nn::CausalLM& model);

// The plan of `model` (the config's, on meta) over `mesh`.
tessera::fsdp::ShardingPlan plan_run(const TrainConfig& config, tessera::nn::CausalLM& model,
                                     const tessera::fsdp::PlanMesh& mesh);

// One mesh of the sweep, per rank.
struct SweepPoint {
  std::string series;  // "FSDP", "HSDP R=2" (2 replicas)
  tessera::fsdp::PlanMesh mesh;
  int64_t parameter_shard_bytes = 0;
  int64_t gradient_shard_bytes = 0;
  int64_t optimizer_state_bytes = 0;  // AdamW's
  int64_t peak_unsharded_bytes = 0;
  std::string peak_moment;             // fsdp::UnshardedPeak::moment
  tessera::fsdp::StepCommVolume comm;  // one optimizer step of --grad-accum micro-batches

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
// shard ranks, up to kSweepMaxRanks in all. A mesh whose shard group
// --reshard-after-forward N does not divide is skipped, saying so.
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
