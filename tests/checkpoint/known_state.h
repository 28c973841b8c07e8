// State dicts for the checkpoint tests: one whose every value follows from
// the step that saved it, so a test can tell an intact checkpoint of step k
// from a torn or mixed one, and zeros of any state's layout to load into.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/sharded_checkpoint.h"

namespace tessera::checkpoint::testing {

// "weights" [rows, 256] f32 sharded on dim 0 over `group` (whole without one),
// "bias" [rows] f64 whole; value i of each is step * 1000 + i % 997.
DistributedStateDict known_state(const dist::ProcessGroupPtr& group, int64_t step, int64_t rows = 2051);
// The same layout, zero-filled, to load into.
DistributedStateDict zero_state(const dist::ProcessGroupPtr& group, int64_t rows = 2051);
// Zeros of the same layout as `state` (whole tensors and DTensors), to load into.
DistributedStateDict zeros_like_state(const DistributedStateDict& state);
// "" when `state` holds exactly step's values; else what is wrong.
std::string check_known_state(const DistributedStateDict& state, int64_t step);

}  // namespace tessera::checkpoint::testing
