// The FSDP equivalence harness: the same training (model and its dtype, data,
// optimizer, clipping) run unsharded in one process and with fully_shard on N
// ranks, so tests can compare losses, gradient norms and parameters step by
// step, bitwise or within the tolerances of equivalence.h. The model is any
// ModelRecipe: GPT, Llama and an MLP classifier come with it.
//
// Data: micro-batch m of step s is fixed by (seed, s, m), whatever the world
// size. Unsharded training takes micro-batches
// 0..N*K-1 of every step; FSDP rank r at accumulation step a takes micro-batch
// a*N + r. Gradients are the mean over all of them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"
#include "nn/activation_checkpoint.h"
#include "nn/models/gpt_config.h"
#include "nn/models/llama_config.h"
#include "tests/fsdp/equivalence.h"

namespace tessera::fsdp::testing {

enum class OptimizerKind { adamw, sgd };

// What the harness trains: the model built on meta in a dtype (called as
// model({inputs, targets}) -> mean loss), the modules fully_shard wraps
// before the root, and a micro-batch of data from a seeded generator.
struct ModelRecipe {
  std::string name;
  std::function<std::shared_ptr<nn::Module>(DType dtype)> build_on_meta;
  std::function<std::vector<nn::Module*>(nn::Module& model)> shard_units;
  std::function<std::pair<Tensor, Tensor>(std::mt19937_64& generator, int64_t batch, int64_t seq_len)> micro_batch;
};

// A CausalLM on random token sequences, its blocks as the units.
ModelRecipe gpt_recipe(nn::GPTConfig config);
ModelRecipe llama_recipe(nn::LlamaConfig config);
// MLP(features, hidden, classes, ReLU) + cross-entropy on Gaussian features
// and random labels (batch * seq_len rows); fc and proj are the units.
ModelRecipe mlp_recipe(int64_t features, int64_t hidden, int64_t classes);

struct TrainingSetup {
  ModelRecipe model;
  DType dtype = DType::f32;  // f64 for comparisons across summation orders
  int64_t batch = 2;       // sequences per micro-batch
  int64_t seq_len = 8;
  int64_t steps = 10;
  int64_t grad_accum = 1;  // micro-batches per rank per step
  // AdamW (betas 0.9, 0.95) or SGD without momentum; both decay matrices by 0.1.
  OptimizerKind optimizer = OptimizerKind::adamw;
  double lr = 1e-2;
  double clip = 0.0;       // 0 = off
  uint64_t seed = 7;
  // Adds a Linear that forward never calls (its parameters get no gradient).
  bool unused_parameters = false;
  // Intra-op threads of the unsharded run and of every rank (see IntraOpThreads).
  int threads = 1;
  // FSDP runs: called on the model once its weights are set and after every
  // optimizer step (float8 training's precomputed scales).
  std::function<void(nn::Module& model)> after_weights_change = nullptr;
};

struct ShardingSetup {
  int world = 1;
  int replicate = 1;  // HSDP replicate degree: a (replicate, world / replicate) mesh
  std::optional<ReshardAfterForward> reshard_after_forward = std::nullopt;  // for every block
  MixedPrecisionPolicy mp_policy = {};
  bool sync_every_micro_batch = true;  // false: set_requires_gradient_sync(false) but on the last
  bool deterministic = false;  // rank-order reductions (the local backend's anyway)
  // Activation checkpointing of the shard units, applied before fully_shard.
  nn::ActivationCheckpointPolicy activation_checkpointing = {};
};

struct TrainingResult {
  std::vector<double> losses;                           // per step, mean over the global batch
  std::map<std::string, std::vector<double>> parameters;  // full values after the last step
  std::vector<double> grad_norms;                       // per step, before clipping
  dist::CommStats fsdp_communication;  // FSDP's collectives over the whole run (train_fsdp*: the root's tree)
};

// One process, `micro_batches` micro-batches per step (the global batch).
TrainingResult train_unsharded(const TrainingSetup& setup, int64_t micro_batches);
// On sharding.world local ranks (run_local); the result is rank 0's.
TrainingResult train_fsdp(const TrainingSetup& setup, const ShardingSetup& sharding);
// On an existing world (any backend; sharding.world and deterministic are the
// world's own); every rank gets the result.
TrainingResult train_fsdp_on(const dist::ProcessGroupPtr& world, const TrainingSetup& setup,
                             const ShardingSetup& sharding);

// On `world` local ranks with fsdp::NaiveFSDP (fsdp/naive_fsdp.h) instead of
// fully_shard: one micro-batch per rank and step (grad_accum 1), no clipping.
TrainingResult train_naive_fsdp(const TrainingSetup& setup, int world, bool deterministic);

// QLoRA on `model` as built (on meta, before sharding): every parameter
// frozen, then each nn::Linear whose name starts with `blocks_prefix` packed
// in NF4 with a rank-2 adapter (alpha 4) seeded by `seed` and its name.
void apply_qlora(nn::Module& model, const std::string& blocks_prefix, uint64_t seed);

// The setup with the model in f64 / with SGD.
TrainingSetup in_f64(TrainingSetup setup);
TrainingSetup with_sgd(TrainingSetup setup);

// Failures name the step or the parameter and element.
void check_close(const TrainingResult& expected, const TrainingResult& actual, const Tolerance& tolerance);
// For runs that do the same arithmetic: losses and parameters bitwise equal,
// gradient norms within reassociated_norm_rtol.
void check_bitwise(const TrainingResult& expected, const TrainingResult& actual);

}  // namespace tessera::fsdp::testing
