// `train --plan`: how the run's model shards over its mesh and what each rank
// will hold, printed without training. The model is built on meta and
// sharded (fully_shard bottom-up) on every rank, which allocates nothing, so
// a plan of Llama 3 8B over 8 ranks takes a moment on a laptop.
#pragma once

#include <ostream>

#include "examples/gpt/resource_limits.h"
#include "examples/gpt/train_config.h"
#include "examples/gpt/trainer.h"

namespace gpt {

// Run on every rank; rank 0 writes to `out`. When this machine can hold the
// ranks' parameter shards (plan_materializes), they are allocated,
// uninitialised, and fsdp::sharding_plan prints its per-parameter plan and
// the bytes a step moves. Otherwise the shards stay on meta and rank 0
// prints why, the parameter count, its shards' bytes as fully_shard laid
// them out (what sharding_plan's "per rank" part would say) and the run's
// memory estimate (estimate_rank_memory).
void print_plan(const TrainConfig& config, const MachineResources& machine, const Distributed& distributed,
                std::ostream& out);

}  // namespace gpt
