// The runs behind docs/fsdp_step_by_step.md: one small GPT trained for a few
// dozen steps on local ranks with fully_shard, with NaiveFSDP, and on one rank
// alone, on the same global batches. One step of each sharded run is traced
// (dist::Tracer: FSDP's phases and every collective) and measured (memory at
// each stage, bytes per FSDP unit). Raw figures only; step_figures.h draws them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm_stats.h"
#include "dist/process_group.h"
#include "dist/trace.h"
#include "fsdp/reshard_after_forward.h"
#include "nn/models/gpt_config.h"
#include "nn/optim/adamw.h"
#include "tensor/tensor.h"

namespace fsdp_figures {

struct RunOptions {
  int ranks = 4;
  int replicate = 1;  // HSDP: a (replicate, ranks / replicate) mesh
  tessera::fsdp::ReshardAfterForward reshard_after_forward = true;  // the blocks'; the root keeps FSDP's never
  bool prefetch = true;  // false: empty prefetch lists on every FSDP module
  int64_t steps = 60;
  int64_t traced_step = 2;  // 1-based: step 1 runs the root's lazy init and records the forward order
  int64_t batch = 2;        // sequences per micro-batch (one micro-batch per rank and step)
  int64_t seq_len = 32;
  double lr = 1e-2;
  uint64_t seed = 7;
  // Small, but with parameters that outweigh one block's activations, as in
  // the models FSDP is for; no biases: fewer, larger tensors to gather.
  tessera::nn::GPTConfig model = {
      .vocab_size = 256, .block_size = 32, .n_layer = 3, .n_head = 4, .n_embd = 128, .bias = false};
};

// Micro-batch `index` of step `step` (0-based): `batch` sequences, each an
// arithmetic progression modulo the vocabulary (t[i+1] = t[i] + stride) with
// its start and stride (1..8) drawn from (seed, step, index), so the next
// token follows from the last two and the loss falls within a few dozen
// steps. inputs, targets: [batch, seq_len] i64.
struct MicroBatch {
  tessera::Tensor inputs, targets;
};
MicroBatch micro_batch(const RunOptions& options, int64_t step, int64_t index);

// A parameter as fully_shard sees it: its name and global shape.
struct ParameterShape {
  std::string name;
  tessera::Shape shape;
};

// One fully_shard call: the module ("" is the root) and the parameters it manages.
struct Unit {
  std::string module;
  std::vector<ParameterShape> parameters;
};

// One rank's memory at one stage of the traced step, in bytes. Every
// reading but `live` is read from what holds the bytes:
//   live        dist::rank_memory_stats().live_bytes above the rank's
//               baseline (before the model was built)
//   shards      the parameters' local shard storages (padded), held all along
//   unsharded   FSDPModule::unsharded_memory() of the root, recursive:
//               all-gather buffers and unsharded parameters (0 for NaiveFSDP)
//   gradients   the storages of the parameters' .grad as the model holds
//               them now: unsharded gradients of a gathered unit during its
//               backward, sharded ones after its reduce-scatter
//   optimizer   AdamW's state (exp_avg, exp_avg_sq, step) of every parameter
// so live - (the rest) is what nothing above holds: activations saved for
// backward, their gradients, reduce-scatter buffers, the batch, temporaries.
struct MemoryReading {
  std::string stage{};
  int64_t live = 0, shards = 0, unsharded = 0, gradients = 0, optimizer = 0;
  std::map<std::string, int64_t> unsharded_by_unit{};  // FSDPModule::unsharded_memory(false) per module
  int64_t activations_and_buffers() const { return live - shards - unsharded - gradients - optimizer; }
};

// One rank's record of the traced step.
struct RankStep {
  std::vector<MemoryReading> memory;
  int64_t peak = 0;  // rank_memory_stats().peak_bytes above the baseline, peak reset at the step's start
  // The rank's live bytes once the shards exist, measured: what to_empty +
  // reset_parameters allocated (fully_shard), what is left once NaiveFSDP
  // has cut the shards and emptied the whole tensors (NaiveFSDP).
  int64_t shards_allocated = 0;
  std::map<std::string, tessera::dist::CommStats> unit_comm;   // FSDPModule::communication_stats(false) per module
  std::map<std::string, tessera::dist::CommStats> group_comm;  // ProcessGroup::stats() per group, same step
};

struct ShardedRun {
  std::vector<double> losses;  // per step: mean over the global batch
  std::vector<tessera::dist::TraceEvent> events;  // the traced step, every rank, in recording order
  std::vector<RankStep> ranks;                    // by rank; empty when untraced
};

// The model's FSDP units as fully_shard makes them: one per block, then the root.
std::vector<Unit> fsdp_units(const RunOptions& options);

// fully_shard on options.ranks local ranks; `deterministic` is
// ProcessGroupOptions::deterministic; `trace` records options.traced_step.
ShardedRun run_fully_shard(const RunOptions& options, bool deterministic, bool trace);
// fsdp::NaiveFSDP on options.ranks local ranks (a 1-D world: no HSDP, no
// reshard or prefetch options), traced at options.traced_step.
ShardedRun run_naive(const RunOptions& options);
// The runs' optimizer (tests/fsdp/training_harness.cpp's): AdamW, betas
// (0.9, 0.95), weight decay 0.1 on matrices only.
std::unique_ptr<tessera::optim::AdamW> make_optimizer(const std::vector<tessera::nn::NamedParameter>& parameters,
                                                      const RunOptions& options);
// Bytes of the distinct live storages behind `tensors` (views share one).
int64_t storage_bytes(const std::vector<tessera::Tensor>& tensors);
// The mean loss over all ranks' micro-batches, as the FSDP harness sums it
// (f64, rank order, one division).
double mean_over_ranks(const tessera::dist::ProcessGroupPtr& world, double loss);

// One process, no FSDP: each step accumulates micro-batches 0..ranks-1 and
// divides the gradients by their count: the global batch of the sharded runs.
std::vector<double> run_one_rank(const RunOptions& options);

}  // namespace fsdp_figures
