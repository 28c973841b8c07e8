// A training step's schedule as the simulator records it, for the step-time
// replay (bench/step_schedule.h): rank 0's second step of a `train` config
// (the first warms the allocator and creates AdamW's state), and the
// ordering part of each recorded op in the replay's terms.
#pragma once

#include <vector>

#include "bench/step_schedule.h"
#include "tensor/cuda/sim/schedule_recorder.h"
#include "train/train_config.h"

namespace bench {

// Runs `config` (on the simulator's devices) for two steps and returns what
// rank 0's device was given in the second.
std::vector<tessera::cuda::sim::ScheduledOp> record_second_step(const tessera::train::TrainConfig& config);

// Records, waits and host waits as they are; kernels, GEMMs and copies as SM
// work and collectives as link work, with no time yet (the caller sets it).
StepOp step_op(const tessera::cuda::sim::ScheduledOp& op);

}  // namespace bench
