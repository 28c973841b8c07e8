// One cuBLASLt matmul, described in cuBLASLt's own terms (column-major
// matrices, op(A), leading dimensions, strided batches, alpha/beta, compute
// type, epilogue), so that the tensor-level adapter (kernel_table.cpp) maps
// tessera's row-major tensors onto it once, and both runtimes take the same
// struct: nvidia/blas_lt.cpp turns it into cublasLt descriptors and calls
// cublasLtMatmul; sim/blas_lt.cpp validates it as cuBLASLt would and computes
// exactly what cuBLASLt's contract promises, on the CPU. A layout or
// descriptor bug therefore shows up on the simulator; only the library call
// itself goes unexercised here.
//
// Per batch b (0 <= b < batch_count), with X_b = X + b * X.batch_stride:
//   pre  = alpha * op(A_b) op(B_b) + beta * C_b (+ bias_b broadcast along columns)
//   D_b  = epilogue(pre), rounded once to D's dtype
// op(A) is [m, k], op(B) is [k, n], C and D are [m, n]; all column-major:
// element (i, j) of a matrix with leading dimension ld is at i + j * ld.
#pragma once

#include <cstdint>
#include <memory>

#include "tensor/dtype.h"

namespace tessera {
class Stream;
}

namespace tessera::cuda {

// CUBLAS_OP_N / CUBLAS_OP_T.
enum class GemmOp : uint8_t { none, transpose };

// cublasComputeType_t: CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32
// (f32 inputs rounded to TF32: 10 mantissa bits, f32 accumulation) and
// CUBLAS_COMPUTE_64F.
enum class GemmCompute : uint8_t { f32, f32_fast_tf32, f64 };

// cublasLtEpilogue_t, the modes tessera uses. GELU is cuBLASLt's tanh
// approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
enum class GemmEpilogue : uint8_t {
  none,           // CUBLASLT_EPILOGUE_DEFAULT
  bias,           // + bias[m]
  gelu,           // GELU(pre)
  gelu_aux,       // aux = pre, D = GELU(pre)
  gelu_bias,      // GELU(pre + bias)
  gelu_aux_bias,  // aux = pre + bias, D = GELU(aux)
  dgelu,          // D = pre * GELU'(aux); aux is an input
  bgradb,         // D = pre; bias[n] = sum over k of op(B)[k, n] (bias is an output)
};

// A matrix as cublasLtMatrixLayout_t sees it: its stored (pre-op) rows and
// cols, column-major with leading dimension ld, and the element distance
// between consecutive batches (0 broadcasts one matrix to every batch).
struct GemmMatrix {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

struct GemmDescriptor {
  GemmOp op_a = GemmOp::none;
  GemmOp op_b = GemmOp::none;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch_count = 1;
  GemmMatrix a, b, c, d;  // c.data may be null when beta == 0; c.data == d.data computes in place
  GemmCompute compute = GemmCompute::f32;
  double alpha = 1.0, beta = 0.0;  // scale type f32 (f64 for f64 compute)
  GemmEpilogue epilogue = GemmEpilogue::none;
  // CUBLASLT_MATMUL_DESC_BIAS_POINTER / _BIAS_BATCH_STRIDE: D's dtype, packed.
  void* bias = nullptr;
  int64_t bias_batch_stride = 0;
  // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER / _AUX_LD / _AUX_BATCH_STRIDE:
  // an [m, n] matrix of D's dtype (ld and batch stride multiples of 8).
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int64_t aux_batch_stride = 0;
  // FP8 (A and B f8e4m3 or f8e5m2, not both f8e5m2; sm_89 and newer):
  // CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / _B_SCALE_POINTER, one f32 each on
  // the device, multiplying the product: pre = alpha * (a_scale * b_scale) *
  // op(A) op(B). cuBLASLt's FP8 kernels take op(A) = T, op(B) = N only, k and
  // the leading dimensions multiples of 16, compute CUBLAS_COMPUTE_32F, C and
  // D f32, bf16 or f16; tessera asks for m and n multiples of 16 too.
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
};

// Whether `dtype` is one of cuBLASLt's FP8 matrix types.
inline bool is_fp8(DType dtype) { return dtype == DType::f8e4m3 || dtype == DType::f8e5m2; }

// cublasLtMatmul on `stream` (a cuda stream of the device holding the
// buffers). Throws tessera::Error naming the descriptor field cuBLASLt would
// refuse (the simulator) or cuBLASLt's status string (nvidia).
void gemm(const GemmDescriptor& descriptor, const std::shared_ptr<Stream>& stream);

// Whether f32 matmuls may round their inputs to TF32 (10 mantissa bits), like
// torch.backends.cuda.matmul.allow_tf32. Process-wide, off by default: f32
// matmuls then use CUBLAS_COMPUTE_32F and are f32 GEMMs.
bool allow_tf32();
void set_allow_tf32(bool allow);

}  // namespace tessera::cuda
