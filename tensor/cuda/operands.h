// From tensors to what cuda kernels take: an Operand (address, dtype,
// layout) and the BufferUse that declares the bytes a launch touches, named
// by role, dtype and shape ("x f32[4, 8]") for the simulator's messages.
#pragma once

#include "tensor/cuda/elementwise.h"
#include "tensor/cuda/kernel_operand.h"
#include "tensor/cuda/launch_config.h"
#include "tensor/tensor.h"

namespace tessera::cuda {

Operand operand(const Tensor& tensor);
BufferUse buffer_use(const char* role, const Tensor& tensor, BufferAccess access);
// A launch on the current stream of the tensors' device, declaring `buffers`.
KernelLaunch launch_on_current_stream(Device device, std::vector<BufferUse> buffers);

}  // namespace tessera::cuda
