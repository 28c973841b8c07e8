// The state a training run checkpoints, as one DistributedStateDict keyed by
// name, so it reshards whatever the world size:
//   "model.<fqn>"            each parameter: its shard as a DTensor when FSDP
//                            sharded it, its boxes when tensor parallelism
//                            split it, else the whole tensor;
//   "optim.<fqn>.<key>"      each optimizer state tensor of that parameter
//                            (AdamW: exp_avg, exp_avg_sq, step), laid out like
//                            the parameter: keyed by name, never by position.
// The entries view the live tensors: load() fills them in place.
#pragma once

#include <string>

#include "checkpoint/sharded_checkpoint.h"
#include "nn/module.h"
#include "nn/optim/optimizer.h"

namespace tessera::checkpoint {

inline constexpr const char* kModelPrefix = "model.";
inline constexpr const char* kOptimizerPrefix = "optim.";

// Every parameter of `module` (named_parameters: a tied one once), keyed
// `prefix` + its name (plain names for a safetensors export).
DistributedStateDict model_state(const nn::Module& module, const std::string& prefix = kModelPrefix);

// Every state tensor of every parameter of `optimizer`. Creates the state
// first (Optimizer::init_state: zeros, step 0, exactly what the first step
// would make), so a checkpoint of a fresh optimizer has it and a loader has
// tensors to fill.
DistributedStateDict optimizer_state(optim::Optimizer& optimizer);

// Model and optimizer together.
DistributedStateDict training_state_dict(const nn::Module& module, optim::Optimizer& optimizer);

// The entry that views `local` laid out like `parameter`: a DTensor with the
// parameter's sharding when FSDP sharded it; a boxed piece when tensor
// parallelism split it (with FSDP's rows of its piece); else the tensor.
StateEntry entry_like(const nn::Parameter& parameter, const Tensor& local);

}  // namespace tessera::checkpoint
