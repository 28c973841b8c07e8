// Host entry point of the dropout kernel (tensor/cuda/dropout.cu).
#pragma once

#include "tensor/cuda/elementwise.h"
#include "tensor/philox.h"

namespace tessera::cuda {

// y, mask (contiguous) and x (any strides) of one dtype (f32 or f64): at
// logical index i, keep = philox_uniform(key, numbering.index(i)) >= p,
// mask = keep ? scale : 0 and y = x * mask: the cpu's Philox draw at the
// same index, so the same bits.
void dropout(const Operand& y, const Operand& mask, const Operand& x, double p, double scale, PhiloxKey key,
             PhiloxNumbering numbering, const KernelLaunch& launch);

}  // namespace tessera::cuda
