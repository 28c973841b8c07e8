// The scales FSDP gathers float8 weights at (nn/float8_all_gather.h), for
// every float8 weight of a model at once.
//
// A float8 weight's scale must be the whole weight's: the amax over every
// piece of it, each rank's FSDP shard of each tensor-parallel piece. Rather
// than one all-reduce a weight, every weight's local amax goes into one
// vector, reduced (max) once over each group the weights are split over:
// the shard group (and, under tensor parallelism, the tp group). So a step
// of float8 training adds one small all-reduce, whatever the layer count.
#pragma once

#include "nn/module.h"

namespace tessera::fsdp {

// Computes the scale of every float8 weight under `root` (nn::Linear::
// use_float8) from its current values: after the weights are set (init, a
// load, a resume) and after each optimizer step, before the next forward.
// Collective over the groups the weights are split over (every rank calls
// it); a weight no one splits gets its own amax, without communication.
// Returns how many weights it scaled.
int64_t precompute_float8_scales(nn::Module& root);

}  // namespace tessera::fsdp
