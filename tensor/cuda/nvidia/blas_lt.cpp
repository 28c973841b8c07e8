// The nvidia runtime's cublasLtMatmul: the GemmDescriptor (tensor/cuda/blas_lt.h)
// turned into cuBLASLt's descriptors, one handle per device, a workspace
// from the caching allocator per call (freed at once: stream order covers
// its reuse on the same stream), and the heuristic's algorithm cached per
// shape. Kept as thin as possible: everything the simulator checks (layouts,
// types, epilogue attributes) is built here from the same struct.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

#include "tensor/cuda/blas_lt.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/nvidia/launch.h"
#include "tensor/error.h"
#include "tensor/stream.h"

namespace tessera::cuda {

namespace {

// 32 MiB, what cuBLAS asks for on Hopper; Ampere's kernels use less.
constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

void check(cublasStatus_t status, const char* what) {
  TESSERA_CHECK(status == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul: {}: {} ({})", what, cublasLtGetStatusString(status),
                cublasLtGetStatusName(status));
}

cudaDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f8e4m3: return CUDA_R_8F_E4M3;
    case DType::f8e5m2: return CUDA_R_8F_E5M2;
    default: fail("cublasLtMatmul: no cuBLASLt matrix type for {}", dtype_name(dtype));
  }
}

cublasOperation_t operation(GemmOp op) { return op == GemmOp::none ? CUBLAS_OP_N : CUBLAS_OP_T; }

cublasLtEpilogue_t epilogue(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::gelu: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::bgradb: return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The largest power of two (up to 256) dividing the address: what the
// heuristic may assume about a pointer.
uint32_t alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t bytes = 256;
  while (bytes > 1 && address % bytes != 0) bytes /= 2;
  return bytes;
}

template <typename Descriptor, cublasStatus_t (*destroy)(Descriptor)>
struct Owned {
  Descriptor value = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (value != nullptr) destroy(value);
  }
};
using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <typename Value>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const Value& value, const char* what) {
  check(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value), what);
}

void make_layout(MatrixLayout& layout, const GemmMatrix& matrix, int64_t batch_count, const char* what) {
  check(cublasLtMatrixLayoutCreate(&layout.value, data_type(matrix.dtype), static_cast<uint64_t>(matrix.rows),
                                   static_cast<uint64_t>(matrix.cols), matrix.ld),
        what);
  if (batch_count == 1) return;
  const int32_t count = static_cast<int32_t>(batch_count);
  check(cublasLtMatrixLayoutSetAttribute(layout.value, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), what);
  check(cublasLtMatrixLayoutSetAttribute(layout.value, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                         &matrix.batch_stride, sizeof matrix.batch_stride),
        what);
}

cublasLtHandle_t handle_of(int device) {
  static std::mutex mutex;
  static std::map<int, cublasLtHandle_t> handles;  // one per device, for the process's lifetime
  std::lock_guard lock(mutex);
  auto [entry, inserted] = handles.try_emplace(device, nullptr);
  if (inserted) check(cublasLtCreate(&entry->second), "cublasLtCreate");
  return entry->second;
}

// Everything the heuristic's choice depends on: the descriptor without its
// pointers, plus the pointers' alignments.
using ShapeKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int, int, int, int, int64_t, int64_t,
                            int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t>;

ShapeKey shape_key(const GemmDescriptor& g, int device) {
  const uint32_t aligned = std::min({alignment(g.a.data), alignment(g.b.data), alignment(g.c.data),
                                     alignment(g.d.data), alignment(g.bias), alignment(g.aux)});
  return {device, static_cast<int>(g.op_a) * 2 + static_cast<int>(g.op_b), static_cast<int>(g.compute),
          g.m, g.n, g.k, g.batch_count, static_cast<int>(g.a.dtype) * 32 + static_cast<int>(g.b.dtype),
          static_cast<int>(g.d.dtype),
          static_cast<int>(g.epilogue), g.beta != 0.0, g.a.ld, g.b.ld, g.c.ld, g.d.ld, g.a.batch_stride,
          g.b.batch_stride, g.d.batch_stride, g.aux_ld, g.bias_batch_stride, aligned};
}

}  // namespace

void gemm(const GemmDescriptor& g, const std::shared_ptr<Stream>& stream) {
  const cudaStream_t native = nvidia::native_stream(stream.get(), "cublasLtMatmul");
  const int device = stream->device().index;
  const cublasLtHandle_t handle = handle_of(device);
  const bool f64 = g.compute == GemmCompute::f64;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F
                                      : g.compute == GemmCompute::f32_fast_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                : CUBLAS_COMPUTE_32F;
  MatmulDesc desc;
  check(cublasLtMatmulDescCreate(&desc.value, compute, f64 ? CUDA_R_64F : CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(desc.value, CUBLASLT_MATMUL_DESC_TRANSA, operation(g.op_a), "TRANSA");
  set(desc.value, CUBLASLT_MATMUL_DESC_TRANSB, operation(g.op_b), "TRANSB");
  set(desc.value, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue(g.epilogue), "EPILOGUE");
  if (g.bias != nullptr) {
    set(desc.value, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, "BIAS_POINTER");
    set(desc.value, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, g.bias_batch_stride, "BIAS_BATCH_STRIDE");
  }
  if (g.aux != nullptr) {
    set(desc.value, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux, "EPILOGUE_AUX_POINTER");
    set(desc.value, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld, "EPILOGUE_AUX_LD");
    set(desc.value, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, g.aux_batch_stride, "EPILOGUE_AUX_BATCH_STRIDE");
  }
  if (g.a_scale != nullptr) set(desc.value, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.a_scale, "A_SCALE_POINTER");
  if (g.b_scale != nullptr) set(desc.value, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.b_scale, "B_SCALE_POINTER");
  // With beta == 0, C is not read: D stands in for it.
  const GemmMatrix& c = g.c.data != nullptr ? g.c : g.d;
  MatrixLayout a, b, c_layout, d;
  make_layout(a, g.a, g.batch_count, "A layout");
  make_layout(b, g.b, g.batch_count, "B layout");
  make_layout(c_layout, c, g.batch_count, "C layout");
  make_layout(d, g.d, g.batch_count, "D layout");

  cublasLtMatmulAlgo_t algo;
  {
    static std::mutex mutex;
    static std::map<ShapeKey, cublasLtMatmulAlgo_t> algorithms;
    const ShapeKey key = shape_key(g, device);
    std::lock_guard lock(mutex);
    auto found = algorithms.find(key);
    if (found == algorithms.end()) {
      Preference preference;
      check(cublasLtMatmulPreferenceCreate(&preference.value), "cublasLtMatmulPreferenceCreate");
      const uint64_t workspace = kWorkspaceBytes;
      check(cublasLtMatmulPreferenceSetAttribute(preference.value, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace, sizeof workspace),
            "MAX_WORKSPACE_BYTES");
      const uint32_t aligned = std::get<20>(key);
      for (const auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        check(cublasLtMatmulPreferenceSetAttribute(preference.value, attribute, &aligned, sizeof aligned),
              "MIN_ALIGNMENT");
      }
      cublasLtMatmulHeuristicResult_t result{};
      int found_count = 0;
      check(cublasLtMatmulAlgoGetHeuristic(handle, desc.value, a.value, b.value, c_layout.value, d.value,
                                           preference.value, 1, &result, &found_count),
            "cublasLtMatmulAlgoGetHeuristic");
      TESSERA_CHECK(found_count > 0,
                    "cublasLtMatmul: no algorithm for m = {}, n = {}, k = {}, batch {}, {} inputs, {} output, "
                    "epilogue {}",
                    g.m, g.n, g.k, g.batch_count, dtype_name(g.a.dtype), dtype_name(g.d.dtype),
                    static_cast<int>(g.epilogue));
      found = algorithms.emplace(key, result.algo).first;
    }
    algo = found->second;
  }

  void* workspace = CachingAllocator::of(stream->device().index).allocate(kWorkspaceBytes, stream);
  const float alpha32 = static_cast<float>(g.alpha), beta32 = static_cast<float>(g.beta);
  const void* alpha = f64 ? static_cast<const void*>(&g.alpha) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&g.beta) : &beta32;
  const cublasStatus_t status =
      cublasLtMatmul(handle, desc.value, alpha, g.a.data, a.value, g.b.data, b.value, beta, c.data, c_layout.value,
                     const_cast<void*>(g.d.data), d.value, &algo, workspace, kWorkspaceBytes, native);
  CachingAllocator::of(stream->device().index).free(workspace);
  check(status, "cublasLtMatmul");
}

}  // namespace tessera::cuda
