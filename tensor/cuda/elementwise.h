// Host entry points of the elementwise kernels (tensor/cuda/elementwise.cu):
// each launches on `launch.stream` with the buffers the caller declared.
// Operands are already checked and shaped by the ops; the compute kernels
// (unary, binary) take f32, f64, i32, i64, bool and bf16 (computed in f32);
// where moves any dtype.
#pragma once

#include <vector>

#include "tensor/cuda/kernel_operand.h"
#include "tensor/cuda/launch_config.h"
#include "tensor/op_kinds.h"

namespace tessera::cuda {

// Throws tessera::Error "cuda::<kernel>: <what> <dtype>" (kernel_table.cpp:
// kernel sources stay free of host-only formatting that nvcc cannot compile).
[[noreturn]] void refuse_operands(const char* kernel, const char* what, DType dtype);

struct KernelLaunch {
  Stream* stream = nullptr;
  std::vector<BufferUse> buffers;
};

void fill(const Operand& out, double value, const KernelLaunch& launch);
void copy(const Operand& out, const Operand& in, const KernelLaunch& launch);
void arange(const Operand& out, double start, double step, const KernelLaunch& launch);
void unary(UnaryOp op, const Operand& out, const Operand& x, const KernelLaunch& launch);
void unary_backward(UnaryOp op, const Operand& grad_in, const Operand& grad_out, const Operand& saved,
                    const KernelLaunch& launch);
void binary(BinaryOp op, const Operand& out, const Operand& a, const Operand& b, const KernelLaunch& launch);
void where(const Operand& out, const Operand& condition, const Operand& a, const Operand& b,
           const KernelLaunch& launch);

}  // namespace tessera::cuda
