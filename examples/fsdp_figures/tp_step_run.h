// The run behind docs/tp_step_by_step.md: a small GPT with tensor
// parallelism inside FSDP, (dp 2, tp 2) on 4 local ranks, trained for a few
// steps beside one rank on the same global batches. One step is traced (the
// tp and dp groups' collectives, the compute phases) and measured (each
// rank's memory at the step's stages, each group's counters, FSDP's own).
// Raw figures only; tp_figures.cpp draws them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dist/comm_stats.h"
#include "dist/trace.h"
#include "examples/fsdp_figures/step_runs.h"
#include "tensor/tensor.h"

namespace fsdp_figures {

struct TensorParallelOptions {
  int dp = 2;
  int tp = 2;
  int64_t steps = 20;
  int64_t traced_step = 2;  // 1-based: step 1 runs the root's lazy init
  // Data, batch and optimizer as the FSDP pictures' (RunOptions), on a GPT
  // whose vocabulary splits unevenly: 255 rows, 128 and 127 over tp 2, then
  // FSDP's 64 + 64 and 64 + 63 over dp 2; with biases, whose row-wise ones
  // and the LayerNorms' hold partial gradients.
  RunOptions run = {.ranks = 2,
                    .batch = 2,
                    .seq_len = 32,
                    .model = {.vocab_size = 255, .block_size = 32, .n_layer = 2, .n_head = 4, .n_embd = 64,
                              .bias = true}};
  int ranks() const { return dp * tp; }
};

// A parameter as tensor parallelism and FSDP lay it out.
struct LaidOutParameter {
  std::string name;
  std::string unit;        // the FSDP module holding it: "blocks.0", "root"
  tessera::Shape logical;  // the 1-rank tensor
  std::string placement;   // "Shard(0)", "Shard(1)", "Replicate()"
  int64_t sections = 1;    // fused qkv: each rank takes its part of each of 3 sections
  bool partial_gradient = false;
  std::vector<tessera::Shape> pieces;  // per tp rank, the piece FSDP shards
};

struct TensorParallelRank {
  int dp = 0, tp = 0;  // its coordinates
  std::vector<MemoryReading> memory;  // at the step's start, after the loss, backward and the optimizer
  int64_t peak = 0;                                        // above the rank's baseline, in the traced step
  std::map<std::string, tessera::dist::CommStats> groups;  // "tp", "dp": ProcessGroup::stats() of the step
  tessera::dist::CommStats fsdp;                           // FSDPModule::communication_stats() of the root
  tessera::dist::CommStats fsdp_over_tp;                   // its part on the tp group (the partial gradients)
};

struct TensorParallelRun {
  TensorParallelOptions options;
  std::vector<LaidOutParameter> parameters;
  std::vector<double> losses;    // per step: mean over the dp ranks' micro-batches
  std::vector<double> one_rank;  // per step: one process on the same global batch
  std::vector<tessera::dist::TraceEvent> events;  // the traced step, every rank
  std::vector<TensorParallelRank> ranks;          // by world rank: (dp, tp) = (rank / tp, rank % tp)
};

TensorParallelRun run_tensor_parallel(const TensorParallelOptions& options);

}  // namespace fsdp_figures
