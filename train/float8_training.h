// --float8: the block projections train in float8 (nn::Linear::use_float8,
// torchao's tensorwise recipe), their weights gathered by FSDP as float8
// codes; the head and the embeddings, whose ranges float8 serves worst, are
// skipped (torchao's recipes skip the output layer too).
#pragma once

#include "nn/models/causal_lm.h"
#include "train/train_config.h"

namespace tessera::train {

// Switches every block projection to float8 (before tensor parallelism and
// fully_shard); nothing unless config.float8. Returns how many.
int64_t prepare_float8(nn::CausalLM& model, const TrainConfig& config);

}  // namespace tessera::train
