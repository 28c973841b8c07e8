// The simulator's cublasLtMatmul: the descriptor validated as cuBLASLt
// validates it (each refusal names the field), its buffers declared to
// memcheck and the stream-ordering checker like any launch, and the product
// computed on the CPU on the stream's worker thread with cuBLASLt's
// arithmetic contract: bf16/f16/f32 inputs accumulate in f32 (f64 in f64),
// the epilogue runs on the accumulator, and D rounds once to its dtype,
// except where an H100 showed a 16-bit D rounding the product first:
// - BIAS adds the bias to the product already rounded to D's dtype and rounds
//   again. An H100 (cuBLASLt 13.0, 2026-11-26, tools/gpu_check.sh) gave
//   bf16(bf16(-11.705) - 0.96875) = -12.625 where one rounding gives
//   -12.6875, in an 18x24x19 product; a 1x1x2 one rounded once (cuBLASLt
//   picks kernels by shape, and they differ). The twin rounds twice, the
//   larger shapes' way.
// - DGELU multiplies the product rounded to D's dtype by GELU'(aux) and
//   rounds again: bf16(bf16(s) GELU'(aux)) matched 99% of the 224,576 bf16
//   elements of two products (rows x features x k = 96x256x64, 1000x200x72)
//   on an H100 (cuBLASLt 13.1, 2026-11-26), one rounding 74% (the misses:
//   the f32 sum's order, which the check could only approximate).
// GELU_AUX_BIAS rounds once there: aux = bf16(s + bias) matched all but 11
// of those elements (bf16(bf16(s) + bias): 70%), and D = bf16(GELU(s +
// bias)) 99.8%. GELU_BIAS is assumed to add its bias the same way.
// The multiply-adds go to the host GEMM backend (tensor/gemm_backend.h),
// which sums in f32 in its own order, as cuBLASLt's kernels sum in theirs.
//
// What cuBLASLt refuses, the twin refuses, each with the field and the
// rule: layouts that do not fit m, n, k and the ops; leading dimensions below
// the rows; type combinations outside the table tessera uses; beta without C;
// C and D in place with different layouts; overlapping batches of D, of a
// GELU_AUX matrix or of a BGRADB vector; an epilogue's missing (or stray)
// bias and aux pointers; aux leading dimensions and batch strides that are
// not multiples of 8 (cublasLt.h); epilogues with CUBLAS_COMPUTE_64F; and
// pointers not aligned to their element type. The toolkit's cublasLt.h
// states no transpose restriction for these epilogues, and an H200 found an
// algorithm for each combination tessera's tests run (BIAS and the GELU
// family with op(A) = T, DGELU likewise, BGRADB with op(B) = T), and an
// H100 for the GELU MLP's (kernel_table.cpp: GELU_AUX_BIAS with op(A) = T,
// DGELU with op(A) = op(B) = N, BGRADB with op(B) = T; 2026-11-26); other
// combinations are accepted here unproven.
//
// FP8 (f8e4m3 / f8e5m2 A and B): validated by cuBLASLt's FP8 rules
// (check_fp8), computed as the exact float8 products summed in f32, times
// a_scale * b_scale taken as one f32, rounded once to D: the contract, not
// yet held to a GPU's bits.
//
// TF32 (CUBLAS_COMPUTE_32F_FAST_TF32): each f32 input is rounded to 10
// mantissa bits to nearest, ties to even (PTX's cvt.rn.tf32.f32); products
// and sums stay f32. An H100 (cuBLASLt 13.0, tools/gpu_check.sh, 2026-11-26)
// rounded the tie 1 + 2^-11 down to 1 and 1 + 3 * 2^-12 up to 1 + 2^-10:
// neither truncation nor cvt.rna's ties away. Allowing TF32 lets cuBLASLt use
// it, not forces it: a 1x1x1 product came back in f32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/cuda/blas_lt.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/cuda/sim/schedule_recorder.h"
#include "tensor/cuda/sim/sim_stream.h"
#include "tensor/cuda/sim/stream_order_checker.h"
#include "tensor/error.h"
#include "tensor/float16_bits.h"
#include "tensor/float8_bits.h"

namespace tessera::cuda {

namespace {

const char* op_name(GemmOp op) { return op == GemmOp::none ? "CUBLAS_OP_N" : "CUBLAS_OP_T"; }

const char* epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::none: return "CUBLASLT_EPILOGUE_DEFAULT";
    case GemmEpilogue::bias: return "CUBLASLT_EPILOGUE_BIAS";
    case GemmEpilogue::gelu: return "CUBLASLT_EPILOGUE_GELU";
    case GemmEpilogue::gelu_aux: return "CUBLASLT_EPILOGUE_GELU_AUX";
    case GemmEpilogue::gelu_bias: return "CUBLASLT_EPILOGUE_GELU_BIAS";
    case GemmEpilogue::gelu_aux_bias: return "CUBLASLT_EPILOGUE_GELU_AUX_BIAS";
    case GemmEpilogue::dgelu: return "CUBLASLT_EPILOGUE_DGELU";
    case GemmEpilogue::bgradb: return "CUBLASLT_EPILOGUE_BGRADB";
  }
  return "?";
}

const char* compute_name(GemmCompute compute) {
  switch (compute) {
    case GemmCompute::f32: return "CUBLAS_COMPUTE_32F";
    case GemmCompute::f32_fast_tf32: return "CUBLAS_COMPUTE_32F_FAST_TF32";
    case GemmCompute::f64: return "CUBLAS_COMPUTE_64F";
  }
  return "?";
}

bool adds_bias(GemmEpilogue e) {
  return e == GemmEpilogue::bias || e == GemmEpilogue::gelu_bias || e == GemmEpilogue::gelu_aux_bias;
}
bool applies_gelu(GemmEpilogue e) {
  return e == GemmEpilogue::gelu || e == GemmEpilogue::gelu_aux || e == GemmEpilogue::gelu_bias ||
         e == GemmEpilogue::gelu_aux_bias;
}
bool writes_aux(GemmEpilogue e) { return e == GemmEpilogue::gelu_aux || e == GemmEpilogue::gelu_aux_bias; }
bool uses_aux(GemmEpilogue e) { return writes_aux(e) || e == GemmEpilogue::dgelu; }

int64_t element_bytes(DType dtype) { return static_cast<int64_t>(element_size(dtype)); }

// Elements from the first to the last one the batches of a [rows, cols]
// column-major matrix reach.
int64_t extent_elements(int64_t rows, int64_t cols, int64_t ld, int64_t batch_stride, int64_t batch_count) {
  if (rows == 0 || cols == 0) return 0;
  return (batch_count - 1) * batch_stride + (cols - 1) * ld + rows;
}

// --- validation, as cublasLtMatmul and its descriptors refuse ---

void check_layout(const char* name, const GemmMatrix& x, int64_t rows, int64_t cols, const std::string& why) {
  TESSERA_CHECK(x.dtype == DType::f32 || x.dtype == DType::f64 || x.dtype == DType::bf16 || x.dtype == DType::f16 ||
                    is_fp8(x.dtype),
                "cuda sim: cublasLtMatmul: {}.dtype {} is not a matrix type tessera's GEMMs use (f32, f64, bf16, f16, "
                "f8e4m3, f8e5m2)",
                name, dtype_name(x.dtype));
  TESSERA_CHECK(x.rows == rows && x.cols == cols,
                "cuda sim: cublasLtMatmul: {} layout is [{} x {}] (rows x cols) but {} needs [{} x {}]", name, x.rows,
                x.cols, why, rows, cols);
  TESSERA_CHECK(x.ld >= std::max<int64_t>(1, rows),
                "cuda sim: cublasLtMatmul: {}.ld = {} is below max(1, rows) = {} of the column-major [{} x {}] {} "
                "(CUBLAS_STATUS_INVALID_VALUE)",
                name, x.ld, std::max<int64_t>(1, rows), rows, cols, name);
  TESSERA_CHECK(x.batch_stride >= 0, "cuda sim: cublasLtMatmul: {}.batch_stride = {} is negative", name,
                x.batch_stride);
}

// cuBLASLt's FP8 matmul (cublasLt.h and the cuBLAS guide's FP8 section):
// e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3; TN only; k and every leading
// dimension multiples of 16; f32 compute; C = D in f32, bf16 or f16; the
// scales as device pointers. m and n multiples of 16 are tessera's own rule
// (the shapes its FP8 path sends), unproven on a GPU as the only ones.
void check_fp8(const GemmDescriptor& g) {
  const DType a = g.a.dtype, b = g.b.dtype, d = g.d.dtype;
  TESSERA_CHECK(is_fp8(a) && is_fp8(b) && !(a == DType::f8e5m2 && b == DType::f8e5m2),
                "cuda sim: cublasLtMatmul: FP8 multiplies e4m3 by e4m3 or e5m2 (either side), got A {} and B {}",
                dtype_name(a), dtype_name(b));
  TESSERA_CHECK(g.op_a == GemmOp::transpose && g.op_b == GemmOp::none,
                "cuda sim: cublasLtMatmul: FP8 takes op_a CUBLAS_OP_T and op_b CUBLAS_OP_N (\"TN\"), got {} and {}",
                op_name(g.op_a), op_name(g.op_b));
  TESSERA_CHECK(g.k % 16 == 0 && g.m % 16 == 0 && g.n % 16 == 0,
                "cuda sim: cublasLtMatmul: FP8 with m, n, k = {}, {}, {}: each must be a multiple of 16", g.m, g.n,
                g.k);
  TESSERA_CHECK(g.a.ld % 16 == 0 && g.b.ld % 16 == 0 && g.d.ld % 16 == 0,
                "cuda sim: cublasLtMatmul: FP8 with leading dimensions {}, {}, {} (A, B, D): each must be a multiple "
                "of 16", g.a.ld, g.b.ld, g.d.ld);
  TESSERA_CHECK(g.compute == GemmCompute::f32, "cuda sim: cublasLtMatmul: FP8 computes in CUBLAS_COMPUTE_32F, not {}",
                compute_name(g.compute));
  TESSERA_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16,
                "cuda sim: cublasLtMatmul: FP8 writes D as f32, bf16 or f16 here, not {}", dtype_name(d));
  TESSERA_CHECK(g.epilogue == GemmEpilogue::none,
                "cuda sim: cublasLtMatmul: tessera's FP8 GEMMs take no epilogue, got {}", epilogue_name(g.epilogue));
  TESSERA_CHECK(g.a_scale != nullptr && g.b_scale != nullptr,
                "cuda sim: cublasLtMatmul: FP8 needs CUBLASLT_MATMUL_DESC_A_SCALE_POINTER and _B_SCALE_POINTER");
}

void check_types(const GemmDescriptor& g) {
  const DType a = g.a.dtype, b = g.b.dtype, c = g.c.dtype, d = g.d.dtype;
  if (is_fp8(a) || is_fp8(b)) {
    check_fp8(g);
    TESSERA_CHECK(c == d || g.c.data == nullptr, "cuda sim: cublasLtMatmul: C is {} and D is {}; cuBLASLt needs "
                  "Ctype == Dtype", dtype_name(c), dtype_name(d));
    return;
  }
  TESSERA_CHECK(g.a_scale == nullptr && g.b_scale == nullptr,
                "cuda sim: cublasLtMatmul: A and B scale pointers are for FP8 matrices; A is {}", dtype_name(a));
  TESSERA_CHECK(a == b, "cuda sim: cublasLtMatmul: A is {} and B is {}; cuBLASLt multiplies matrices of one type",
                dtype_name(a), dtype_name(b));
  TESSERA_CHECK(c == d, "cuda sim: cublasLtMatmul: C is {} and D is {}; cuBLASLt needs Ctype == Dtype", dtype_name(c),
                dtype_name(d));
  switch (g.compute) {
    case GemmCompute::f64:
      TESSERA_CHECK(a == DType::f64 && d == DType::f64,
                    "cuda sim: cublasLtMatmul: compute CUBLAS_COMPUTE_64F takes f64 A, B, C, D, got A {} and D {}",
                    dtype_name(a), dtype_name(d));
      TESSERA_CHECK(g.epilogue == GemmEpilogue::none,
                    "cuda sim: cublasLtMatmul: epilogue {} with CUBLAS_COMPUTE_64F: tessera uses epilogues only on "
                    "f32-compute GEMMs (cuBLASLt's heuristics offer no f64 epilogue kernels to rely on)",
                    epilogue_name(g.epilogue));
      return;
    case GemmCompute::f32_fast_tf32:
      TESSERA_CHECK(a == DType::f32 && d == DType::f32,
                    "cuda sim: cublasLtMatmul: compute CUBLAS_COMPUTE_32F_FAST_TF32 takes f32 A, B, C, D, got A {} "
                    "and D {}",
                    dtype_name(a), dtype_name(d));
      return;
    case GemmCompute::f32:
      TESSERA_CHECK(a != DType::f64,
                    "cuda sim: cublasLtMatmul: f64 A and B need compute CUBLAS_COMPUTE_64F, not {}", compute_name(g.compute));
      TESSERA_CHECK(d == a || d == DType::f32,
                    "cuda sim: cublasLtMatmul: {} A and B with {} write D as {} or f32, not {}", dtype_name(a),
                    compute_name(g.compute), dtype_name(a), dtype_name(d));
      return;
  }
}

// cuBLASLt loads each matrix and vector by whole elements, and a GPU
// access must be naturally aligned: no algorithm takes a pointer below its
// element's alignment (cuBLASLt's MIN_ALIGNMENT preferences start there).
void check_aligned(const char* name, const void* data, DType dtype) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  TESSERA_CHECK(address % static_cast<uintptr_t>(element_bytes(dtype)) == 0,
                "cuda sim: cublasLtMatmul: the {} pointer {} is not aligned to its {}-byte {} elements; cuBLASLt "
                "needs every matrix and vector aligned to its element type",
                name, data, element_bytes(dtype), dtype_name(dtype));
}

// What an epilogue writes per batch (cublasLt.h: BIAS_BATCH_STRIDE and
// AUX_BATCH_STRIDE are the distance between the batches' vectors and
// matrices, 0 by default): with batch_count > 1 the batches' outputs must
// not overlap, or they overwrite each other in an order no one chose.
void check_epilogue_batches(const GemmDescriptor& g, const char* name) {
  if (g.batch_count == 1) return;
  if (g.epilogue == GemmEpilogue::bgradb) {
    TESSERA_CHECK(g.bias_batch_stride >= g.n,
                  "cuda sim: cublasLtMatmul: epilogue {} with batch_count = {} writes a bias gradient of n = {} per "
                  "batch, but bias_batch_stride = {} makes them overlap (CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE "
                  "must be at least n)",
                  name, g.batch_count, g.n, g.bias_batch_stride);
  }
  if (writes_aux(g.epilogue)) {
    const int64_t extent = extent_elements(g.m, g.n, g.aux_ld, 0, 1);
    TESSERA_CHECK(g.aux_batch_stride >= extent,
                  "cuda sim: cublasLtMatmul: epilogue {} with batch_count = {} writes an aux matrix [{} x {}] (ld {}) "
                  "per batch, but aux_batch_stride = {} makes them overlap "
                  "(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE must be at least {})",
                  name, g.batch_count, g.m, g.n, g.aux_ld, g.aux_batch_stride, extent);
  }
}

void check_epilogue(const GemmDescriptor& g) {
  const char* name = epilogue_name(g.epilogue);
  if (adds_bias(g.epilogue) || g.epilogue == GemmEpilogue::bgradb) {
    TESSERA_CHECK(g.bias != nullptr, "cuda sim: cublasLtMatmul: epilogue {} needs CUBLASLT_MATMUL_DESC_BIAS_POINTER",
                  name);
    TESSERA_CHECK(g.bias_batch_stride >= 0, "cuda sim: cublasLtMatmul: bias_batch_stride = {} is negative",
                  g.bias_batch_stride);
  } else {
    TESSERA_CHECK(g.bias == nullptr,
                  "cuda sim: cublasLtMatmul: a bias pointer is set but epilogue {} neither reads nor writes a bias",
                  name);
  }
  if (uses_aux(g.epilogue)) {
    TESSERA_CHECK(g.aux != nullptr,
                  "cuda sim: cublasLtMatmul: epilogue {} needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", name);
    TESSERA_CHECK(g.aux_ld >= std::max<int64_t>(1, g.m) && g.aux_ld % 8 == 0,
                  "cuda sim: cublasLtMatmul: aux_ld = {} with epilogue {}: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD must "
                  "be set, a multiple of 8 and at least m = {}",
                  g.aux_ld, name, g.m);
    TESSERA_CHECK(g.aux_batch_stride >= 0 && g.aux_batch_stride % 8 == 0,
                  "cuda sim: cublasLtMatmul: aux_batch_stride = {} must be a non-negative multiple of 8",
                  g.aux_batch_stride);
  } else {
    TESSERA_CHECK(g.aux == nullptr,
                  "cuda sim: cublasLtMatmul: an aux pointer is set but epilogue {} neither reads nor writes aux", name);
  }
  check_epilogue_batches(g, name);
}

void validate(const GemmDescriptor& g) {
  TESSERA_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "cuda sim: cublasLtMatmul: m, n, k = {}, {}, {} must be >= 0", g.m,
                g.n, g.k);
  TESSERA_CHECK(g.batch_count >= 1, "cuda sim: cublasLtMatmul: batch_count = {} must be >= 1", g.batch_count);
  const std::string op_a = fmt::format("op_a {} with m = {}, k = {}", op_name(g.op_a), g.m, g.k);
  const std::string op_b = fmt::format("op_b {} with k = {}, n = {}", op_name(g.op_b), g.k, g.n);
  check_layout("A", g.a, g.op_a == GemmOp::none ? g.m : g.k, g.op_a == GemmOp::none ? g.k : g.m, op_a);
  check_layout("B", g.b, g.op_b == GemmOp::none ? g.k : g.n, g.op_b == GemmOp::none ? g.n : g.k, op_b);
  const std::string m_n = fmt::format("m = {}, n = {}", g.m, g.n);
  check_layout("D", g.d, g.m, g.n, m_n);
  if (g.beta != 0.0 || g.c.data != nullptr) check_layout("C", g.c, g.m, g.n, m_n);
  check_types(g);
  TESSERA_CHECK(g.beta == 0.0 || g.c.data != nullptr || g.m * g.n == 0,
                "cuda sim: cublasLtMatmul: beta = {} reads C, but C's pointer is null", g.beta);
  TESSERA_CHECK(g.c.data == nullptr || g.c.data != g.d.data || (g.c.ld == g.d.ld && g.c.batch_stride == g.d.batch_stride),
                "cuda sim: cublasLtMatmul: C and D share memory (in place) with different layouts (ldc {} vs ldd {}, "
                "batch strides {} vs {}); cuBLASLt needs them equal",
                g.c.ld, g.d.ld, g.c.batch_stride, g.d.batch_stride);
  TESSERA_CHECK(g.batch_count == 1 || g.d.batch_stride >= extent_elements(g.m, g.n, g.d.ld, 0, 1),
                "cuda sim: cublasLtMatmul: D.batch_stride = {} makes batches of the [{} x {}] D (ld {}) overlap",
                g.d.batch_stride, g.m, g.n, g.d.ld);
  check_epilogue(g);
  check_aligned("A", g.a.data, g.a.dtype);
  check_aligned("B", g.b.data, g.b.dtype);
  check_aligned("C", g.c.data, g.c.dtype);
  check_aligned("D", g.d.data, g.d.dtype);
  check_aligned("bias", g.bias, g.d.dtype);
  check_aligned("aux", g.aux, g.d.dtype);
  check_aligned("A scale", g.a_scale, DType::f32);
  check_aligned("B scale", g.b_scale, DType::f32);
}

// --- the buffers a call touches ---

BufferUse matrix_use(const char* name, const GemmMatrix& x, int64_t batch_count, BufferAccess access) {
  const int64_t bytes = extent_elements(x.rows, x.cols, x.ld, x.batch_stride, batch_count) * element_bytes(x.dtype);
  return BufferUse{fmt::format("{} {}[{} x {}, ld {}]", name, dtype_name(x.dtype), x.rows, x.cols, x.ld), x.data,
                   bytes, access};
}

std::vector<BufferUse> buffers_of(const GemmDescriptor& g) {
  const bool in_place = g.c.data != nullptr && g.c.data == g.d.data;
  std::vector<BufferUse> buffers;
  buffers.push_back(matrix_use("A", g.a, g.batch_count, BufferAccess::read));
  buffers.push_back(matrix_use("B", g.b, g.batch_count, BufferAccess::read));
  if (g.beta != 0.0 && !in_place) buffers.push_back(matrix_use("C", g.c, g.batch_count, BufferAccess::read));
  const BufferAccess d_access = g.beta != 0.0 && in_place ? BufferAccess::read_write : BufferAccess::write;
  buffers.push_back(matrix_use("D", g.d, g.batch_count, d_access));
  const int64_t d_bytes = element_bytes(g.d.dtype);
  if (adds_bias(g.epilogue) || g.epilogue == GemmEpilogue::bgradb) {
    const int64_t length = g.epilogue == GemmEpilogue::bgradb ? g.n : g.m;
    const int64_t elements = length == 0 ? 0 : (g.batch_count - 1) * g.bias_batch_stride + length;
    buffers.push_back(BufferUse{fmt::format("bias {}[{}]", dtype_name(g.d.dtype), length), g.bias,
                                elements * d_bytes,
                                g.epilogue == GemmEpilogue::bgradb ? BufferAccess::write : BufferAccess::read});
  }
  if (uses_aux(g.epilogue)) {
    GemmMatrix aux{g.aux, g.d.dtype, g.m, g.n, g.aux_ld, g.aux_batch_stride};
    buffers.push_back(matrix_use("aux", aux, g.batch_count, writes_aux(g.epilogue) ? BufferAccess::write : BufferAccess::read));
  }
  if (g.a_scale != nullptr) buffers.push_back(BufferUse{"A scale f32", g.a_scale, 4, BufferAccess::read});
  if (g.b_scale != nullptr) buffers.push_back(BufferUse{"B scale f32", g.b_scale, 4, BufferAccess::read});
  std::erase_if(buffers, [](const BufferUse& buffer) { return buffer.bytes == 0; });
  return buffers;
}

// --- the arithmetic ---

// f32 to TF32: 10 mantissa bits, to nearest, ties to even (cvt.rn.tf32.f32).
float round_to_tf32(float value) {
  if (!std::isfinite(value)) return value;
  const uint32_t bits = float16_bits::bits_of(value);
  const uint32_t kept_lsb = (bits >> 13) & 1u;
  return float16_bits::float_of((bits + 0xfffu + kept_lsb) & 0xffffe000u);
}

template <typename Acc>
Acc load(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::f32: return static_cast<Acc>(static_cast<const float*>(base)[index]);
    case DType::f64: return static_cast<Acc>(static_cast<const double*>(base)[index]);
    case DType::bf16: return static_cast<Acc>(float16_bits::float_from_bfloat16(static_cast<const uint16_t*>(base)[index]));
    case DType::f16: return static_cast<Acc>(float16_bits::float_from_half(static_cast<const uint16_t*>(base)[index]));
    case DType::f8e4m3:
    case DType::f8e5m2: {
      const uint8_t code = static_cast<const uint8_t*>(base)[index];
      return static_cast<Acc>(
          float8_bits::float_from_code(code, dtype == DType::f8e4m3 ? float8_bits::e4m3() : float8_bits::e5m2()));
    }
    default: return Acc(0);
  }
}

// Writes `value` rounded once to `dtype`, and tells initcheck.
template <typename Acc>
void store(void* base, DType dtype, int64_t index, Acc value) {
  const int64_t bytes = static_cast<int64_t>(element_size(dtype));
  sim::mark_device_written(static_cast<char*>(base) + index * bytes, bytes);
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[index] = static_cast<float>(value); return;
    case DType::f64: static_cast<double*>(base)[index] = static_cast<double>(value); return;
    case DType::bf16:
      static_cast<uint16_t*>(base)[index] = float16_bits::bfloat16_from_float(static_cast<float>(value));
      return;
    case DType::f16: static_cast<uint16_t*>(base)[index] = float16_bits::half_from_float(static_cast<float>(value)); return;
    default: return;
  }
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

template <typename Acc>
Acc gelu_tanh(Acc x) {
  const Acc u = Acc(kSqrt2OverPi) * (x + Acc(kGeluCubic) * x * x * x);
  return Acc(0.5) * x * (Acc(1) + std::tanh(u));
}

template <typename Acc>
Acc gelu_tanh_derivative(Acc x) {
  const Acc t = std::tanh(Acc(kSqrt2OverPi) * (x + Acc(kGeluCubic) * x * x * x));
  const Acc du = Acc(kSqrt2OverPi) * (Acc(1) + Acc(3 * kGeluCubic) * x * x);
  return Acc(0.5) * (Acc(1) + t) + Acc(0.5) * x * (Acc(1) - t * t) * du;
}

// The [rows, cols] matrix of batch `batch` as an Acc array the host GEMM can
// read: the device memory itself when no conversion is needed, else a dense
// column-major copy (leading dimension rows) of the converted values.
template <typename Acc>
cpu::GemmMatrix<Acc> gemm_operand(const GemmMatrix& x, GemmOp op, int64_t batch, bool tf32,
                                  std::vector<Acc>& scratch) {
  const int64_t first = batch * x.batch_stride;
  if (x.dtype == dtype_of<Acc>::value && !tf32) {
    return {static_cast<const Acc*>(x.data) + first, op == GemmOp::transpose, x.ld};
  }
  scratch.resize(static_cast<size_t>(x.rows * x.cols));
  for (int64_t col = 0; col < x.cols; ++col) {
    for (int64_t row = 0; row < x.rows; ++row) {
      Acc value = load<Acc>(x.data, x.dtype, first + row + col * x.ld);
      if (tf32) value = static_cast<Acc>(round_to_tf32(static_cast<float>(value)));
      scratch[static_cast<size_t>(row + col * x.rows)] = value;
    }
  }
  return {scratch.data(), op == GemmOp::transpose, std::max<int64_t>(1, x.rows)};
}

// `value` rounded to a 16-bit D's dtype (bf16, f16) and back; f32 and f64
// pass unchanged.
template <typename Acc>
Acc rounded_to_16_bit(DType dtype, Acc value) {
  switch (dtype) {
    case DType::bf16:
      return static_cast<Acc>(float16_bits::float_from_bfloat16(float16_bits::bfloat16_from_float(static_cast<float>(value))));
    case DType::f16:
      return static_cast<Acc>(float16_bits::float_from_half(float16_bits::half_from_float(static_cast<float>(value))));
    default: return value;
  }
}

template <typename Acc>
void run_gemm(const GemmDescriptor& g, GemmBackend backend) {
  const bool tf32 = g.compute == GemmCompute::f32_fast_tf32;
  // FP8: the products of two float8 values are exact in f32; the scales
  // multiply as one f32 factor.
  const Acc scales = g.a_scale == nullptr ? Acc(1)
                                          : static_cast<Acc>(*static_cast<const float*>(g.a_scale) *
                                                             *static_cast<const float*>(g.b_scale));
  const Acc alpha = static_cast<Acc>(g.alpha), beta = static_cast<Acc>(g.beta);
  const size_t m = static_cast<size_t>(g.m), n = static_cast<size_t>(g.n);
  void* d = const_cast<void*>(g.d.data);  // D shares GemmMatrix with the inputs; it is the output
  std::vector<Acc> product(m * n), a_scratch, b_scratch;
  for (int64_t batch = 0; batch < g.batch_count; ++batch) {
    // product[j * m + i] = (op(A) op(B))(i, j): the host GEMM computes
    // op(B)^T op(A)^T row-major, which is the column-major product.
    std::fill(product.begin(), product.end(), Acc(0));
    if (g.k > 0 && g.m > 0 && g.n > 0) {
      const cpu::GemmMatrix<Acc> a = gemm_operand<Acc>(g.a, g.op_a, batch, tf32, a_scratch);
      const cpu::GemmMatrix<Acc> b = gemm_operand<Acc>(g.b, g.op_b, batch, tf32, b_scratch);
      cpu::gemm<Acc>(backend, g.n, g.m, g.k, b, a, product.data());
    }
    const int64_t d_first = batch * g.d.batch_stride, c_first = batch * g.c.batch_stride;
    const int64_t aux_first = batch * g.aux_batch_stride, bias_first = batch * g.bias_batch_stride;
    for (int64_t j = 0; j < g.n; ++j) {
      for (int64_t i = 0; i < g.m; ++i) {
        Acc value = alpha * (scales * product[static_cast<size_t>(j * g.m + i)]);
        if (g.beta != 0.0) value += beta * load<Acc>(g.c.data, g.c.dtype, c_first + i + j * g.c.ld);
        // BIAS and DGELU round the product to a 16-bit D first, as measured (top of this file).
        if (g.epilogue == GemmEpilogue::bias || g.epilogue == GemmEpilogue::dgelu) {
          value = rounded_to_16_bit(g.d.dtype, value);
        }
        if (adds_bias(g.epilogue)) value += load<Acc>(g.bias, g.d.dtype, bias_first + i);
        if (writes_aux(g.epilogue)) store<Acc>(g.aux, g.d.dtype, aux_first + i + j * g.aux_ld, value);
        if (applies_gelu(g.epilogue)) value = gelu_tanh(value);
        if (g.epilogue == GemmEpilogue::dgelu) {
          value *= gelu_tanh_derivative(load<Acc>(g.aux, g.d.dtype, aux_first + i + j * g.aux_ld));
        }
        store<Acc>(d, g.d.dtype, d_first + i + j * g.d.ld, value);
      }
    }
    if (g.epilogue == GemmEpilogue::bgradb) {  // bias[j] = sum over k of op(B)(p, j), in k order
      const int64_t b_first = batch * g.b.batch_stride;
      for (int64_t j = 0; j < g.n; ++j) {
        Acc sum = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          const int64_t index = g.op_b == GemmOp::none ? p + j * g.b.ld : j + p * g.b.ld;
          sum += load<Acc>(g.b.data, g.b.dtype, b_first + index);
        }
        store<Acc>(g.bias, g.d.dtype, bias_first + j, sum);
      }
    }
  }
}

// What a roofline needs: each operand's bytes once (a broadcast matrix once),
// and 2 FLOPs per multiply-add.
void count(const GemmDescriptor& g, int64_t scheduled) {
  const auto matrix_bytes = [&](const GemmMatrix& x) {
    const int64_t copies = x.batch_stride == 0 ? 1 : g.batch_count;
    return copies * x.rows * x.cols * element_bytes(x.dtype);
  };
  const int64_t d_elements = g.batch_count * g.m * g.n, d_bytes = element_bytes(g.d.dtype);
  int64_t read = matrix_bytes(g.a) + matrix_bytes(g.b);
  int64_t written = d_elements * d_bytes;
  if (g.beta != 0.0) read += matrix_bytes(g.c);
  const int64_t bias_copies = g.bias_batch_stride == 0 ? 1 : g.batch_count;
  if (adds_bias(g.epilogue)) read += bias_copies * g.m * d_bytes;
  if (g.epilogue == GemmEpilogue::bgradb) written += bias_copies * g.n * d_bytes;
  if (writes_aux(g.epilogue)) written += d_elements * d_bytes;
  if (g.epilogue == GemmEpilogue::dgelu) read += d_elements * d_bytes;
  if (g.a_scale != nullptr) read += 2 * 4;  // the FP8 scales, one f32 each
  sim::count_library_call("cublasLtMatmul", read, written, 2 * g.batch_count * g.m * g.n * g.k);
  sim::schedule_counts(scheduled, read + written, 0, 2 * g.batch_count * g.m * g.n * g.k);
}

}  // namespace

void gemm(const GemmDescriptor& descriptor, const std::shared_ptr<Stream>& stream) {
  const sim::RuntimeCall call("cublasLtMatmul");
  auto* sim_stream = dynamic_cast<sim::SimStream*>(stream.get());
  TESSERA_CHECK(sim_stream != nullptr, "cuda sim: cublasLtMatmul on a {} stream (it runs on cuda streams)",
                stream == nullptr ? "null" : stream->device().str());
  validate(descriptor);
  const std::vector<BufferUse> buffers = buffers_of(descriptor);
  sim::check_device_buffers("cublasLtMatmul", stream->device().index, buffers);
  sim::StreamOrderChecker::instance().check_and_record(sim_stream->checker_id(), "cublasLtMatmul", buffers);
  const GemmBackend backend = gemm_backend();  // read on the host: it may throw
  const int64_t scheduled = sim::schedule_op(*stream, {.kind = sim::ScheduledOp::Kind::gemm,
                                                       .name = "cublasLtMatmul",
                                                       .m = descriptor.m,
                                                       .n = descriptor.n,
                                                       .k = descriptor.k,
                                                       .batch = descriptor.batch_count});
  stream->enqueue([descriptor, backend, scheduled] {
    if (descriptor.compute == GemmCompute::f64) {
      run_gemm<double>(descriptor, backend);
    } else {
      run_gemm<float>(descriptor, backend);
    }
    count(descriptor, scheduled);
  });
}

}  // namespace tessera::cuda
