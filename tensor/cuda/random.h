// Host entry point of the random-number kernel (tensor/cuda/random.cu).
#pragma once

#include "tensor/cuda/elementwise.h"
#include "tensor/philox.h"

namespace tessera::cuda {

// out (floating) = element first_index + i of `key`'s Philox sequence, for
// logical index i, mapped to [a, b) (uniform) or mean a, std b (normal),
// exactly as the cpu kernel computes it.
void random(const Operand& out, RandomDistribution distribution, PhiloxKey key, double a, double b,
            uint64_t first_index, const KernelLaunch& launch);

}  // namespace tessera::cuda
