// Host entry point of the dequantisation kernels (tensor/cuda/quantization.cu).
#pragma once

#include "tensor/cuda/elementwise.h"

namespace tessera::cuda {

// out (contiguous [rows, in], f32, f64, bf16 or f16) = the NF4 rows of
// `packed` (contiguous u8 [rows, row_bytes]) dequantised: the cpu's bits
// (tensor/nf4_format.h is one host-device source).
void nf4_dequantize(const Operand& out, const Operand& packed, int64_t in, const KernelLaunch& launch);

}  // namespace tessera::cuda
