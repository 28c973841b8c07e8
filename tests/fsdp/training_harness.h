// The FSDP equivalence harness: the same training (model, data, AdamW,
// clipping) run unsharded in one process and with fully_shard on N ranks, so
// tests can compare losses and parameters step by step.
//
// Data: micro-batch m of step s is a fixed set of random token sequences,
// whatever the world size. Unsharded training takes micro-batches
// 0..N*K-1 of every step; FSDP rank r at accumulation step a takes micro-batch
// a*N + r. Gradients are the mean over all of them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "nn/gpt.h"

namespace tessera::fsdp::testing {

struct TrainingSetup {
  nn::GPTConfig model;
  int64_t batch = 2;       // sequences per micro-batch
  int64_t seq_len = 8;
  int64_t steps = 10;
  int64_t grad_accum = 1;  // micro-batches per rank per step
  double lr = 1e-2;
  double clip = 0.0;       // 0 = off
  uint64_t seed = 7;
  // Adds a Linear that forward never calls (its parameters get no gradient).
  bool unused_parameters = false;
};

struct ShardingSetup {
  int world = 1;
  int replicate = 1;  // HSDP replicate degree: a (replicate, world / replicate) mesh
  std::optional<ReshardAfterForward> reshard_after_forward = std::nullopt;  // for every block
  MixedPrecisionPolicy mp_policy = {};
  bool sync_every_micro_batch = true;  // false: set_requires_gradient_sync(false) but on the last
  bool deterministic = false;
  int threads_per_rank = 1;
};

struct TrainingResult {
  std::vector<double> losses;                           // per step, mean over the global batch
  std::map<std::string, std::vector<double>> parameters;  // full values after the last step
  std::vector<double> grad_norms;
};

// One process, `micro_batches` micro-batches per step (the global batch).
TrainingResult train_unsharded(const TrainingSetup& setup, int64_t micro_batches);
// On sharding.world local ranks (run_local); the result is rank 0's.
TrainingResult train_fsdp(const TrainingSetup& setup, const ShardingSetup& sharding);
// On an existing world (any backend; sharding.world, threads and
// deterministic are the world's own); every rank gets the result.
TrainingResult train_fsdp_on(const dist::ProcessGroupPtr& world, const TrainingSetup& setup,
                             const ShardingSetup& sharding);

// Checks losses within `loss_rtol` relative and every parameter within
// `param_tol` absolute plus relative; failures name the step or parameter.
void check_close(const TrainingResult& expected, const TrainingResult& actual, double loss_rtol, double param_tol);
void check_bitwise(const TrainingResult& expected, const TrainingResult& actual);

}  // namespace tessera::fsdp::testing
