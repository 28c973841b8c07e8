// The cuda device the trainer's cuda tests run on (the simulator, or a GPU in
// an nvidia build).
#pragma once

#include "tensor/device.h"

namespace tessera::testing {

inline constexpr Device kCuda{DeviceType::cuda};

}  // namespace tessera::testing
