// The GEMM engines: Eigen's (always) and a CBLAS one (OpenBLAS, when built
// with TESSERA_HAVE_BLAS), and the choice between them.
#include "tensor/cpu/gemm.h"

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <type_traits>

#include "tensor/error.h"
#include "tensor/gemm_backend.h"

#ifndef TESSERA_HAVE_BLAS
#define TESSERA_HAVE_BLAS 0  // built outside meson (tests/fuzz): Eigen only
#endif
#if TESSERA_HAVE_BLAS
#include <cblas.h>
#endif

namespace tessera {

namespace {

constexpr bool kBlasBuilt = TESSERA_HAVE_BLAS != 0;

GemmBackend backend_from_environment() {
  const char* name = std::getenv("TESSERA_GEMM");
  if (name == nullptr || *name == '\0') return kBlasBuilt ? GemmBackend::blas : GemmBackend::eigen;
  try {
    return gemm_backend_named(name);
  } catch (const Error& error) {
    fail("TESSERA_GEMM: {}", error.what());
  }
}

// -1: not chosen yet.
std::atomic<int> g_backend{-1};

}  // namespace

GemmBackend gemm_backend() {
  int chosen = g_backend.load(std::memory_order_relaxed);
  if (chosen < 0) {
    int unset = -1;
    g_backend.compare_exchange_strong(unset, static_cast<int>(backend_from_environment()));
    chosen = g_backend.load();
  }
  return static_cast<GemmBackend>(chosen);
}

bool gemm_backend_built(GemmBackend backend) { return backend == GemmBackend::eigen || kBlasBuilt; }

void set_gemm_backend(GemmBackend backend) {
  TESSERA_CHECK(gemm_backend_built(backend), "set_gemm_backend: this build has no {} backend",
                gemm_backend_name(backend));
  g_backend = static_cast<int>(backend);
}

const char* gemm_backend_name(GemmBackend backend) { return backend == GemmBackend::blas ? "blas" : "eigen"; }

GemmBackend gemm_backend_named(std::string_view name) {
  if (name == "eigen") return GemmBackend::eigen;
  TESSERA_CHECK(name == "blas", "unknown GEMM backend '{}': expected eigen or blas", name);
  TESSERA_CHECK(kBlasBuilt, "the blas GEMM backend is not in this build (configure with -Dblas=enabled, after "
                            "tools/setup.sh installs libopenblas-openmp-dev)");
  return GemmBackend::blas;
}

std::string gemm_description() {
#if TESSERA_HAVE_BLAS
  if (gemm_backend() == GemmBackend::blas) {
    // openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64"
    const std::string config = openblas_get_config();
    const std::string version = config.substr(0, config.find(' ', config.find(' ') + 1));
    const int parallel = openblas_get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
    return fmt::format("{} ({}, {} kernels)", version,
                       parallel == 2 ? "OpenMP" : parallel == 1 ? "pthreads" : "sequential", openblas_get_corename());
  }
#endif
  return fmt::format("Eigen {}.{}.{}", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
}

namespace cpu {

namespace {

template <typename T, int Order>
using EigenOperand =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using EigenResult = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned>;

template <typename T, int LhsOrder, int RhsOrder>
void eigen_gemm(int64_t m, int64_t n, int64_t k, GemmMatrix<T> a, GemmMatrix<T> b, T* out) {
  const EigenOperand<T, LhsOrder> lhs(a.data, m, k, Eigen::OuterStride<>(a.leading));
  const EigenOperand<T, RhsOrder> rhs(b.data, k, n, Eigen::OuterStride<>(b.leading));
  EigenResult<T>(out, m, n).noalias() = lhs * rhs;
}

template <typename T>
void eigen_gemm(int64_t m, int64_t n, int64_t k, GemmMatrix<T> a, GemmMatrix<T> b, T* out) {
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (!a.col_major && !b.col_major) eigen_gemm<T, R, R>(m, n, k, a, b, out);
  if (!a.col_major && b.col_major) eigen_gemm<T, R, C>(m, n, k, a, b, out);
  if (a.col_major && !b.col_major) eigen_gemm<T, C, R>(m, n, k, a, b, out);
  if (a.col_major && b.col_major) eigen_gemm<T, C, C>(m, n, k, a, b, out);
}

#if TESSERA_HAVE_BLAS
// CBLAS takes int sizes: larger products stay with Eigen.
bool fits_blas_int(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb) {
  const int64_t limit = std::numeric_limits<int>::max();
  return m <= limit && n <= limit && k <= limit && lda <= limit && ldb <= limit;
}

// Row-major CBLAS: a column-major operand is the transpose of a row-major one
// with the same leading dimension.
template <typename T>
void blas_gemm(int64_t m, int64_t n, int64_t k, GemmMatrix<T> a, GemmMatrix<T> b, T* out) {
  const auto trans = [](bool col_major) { return col_major ? CblasTrans : CblasNoTrans; };
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const int lda = static_cast<int>(a.leading), ldb = static_cast<int>(b.leading);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, trans(a.col_major), trans(b.col_major), M, N, K, 1.0f, a.data, lda, b.data, ldb, 0.0f,
                out, N);
  } else {
    cblas_dgemm(CblasRowMajor, trans(a.col_major), trans(b.col_major), M, N, K, 1.0, a.data, lda, b.data, ldb, 0.0,
                out, N);
  }
}

// One row of output (m == 1) or one column (n == 1) as a matrix-vector
// product: OpenBLAS's GEMM (0.3.21) packs the whole matrix operand first,
// which for x @ W^T with one row x (a decoding step: every linear layer) costs
// more than the product, where GEMV streams W once. Eigen's product takes
// the same turn by itself.
template <typename T>
void blas_gemv(int64_t m, int64_t n, int64_t k, GemmMatrix<T> a, GemmMatrix<T> b, T* out) {
  const auto run = [out](CBLAS_TRANSPOSE trans, int64_t rows, int64_t cols, const T* matrix, int64_t leading,
                         const T* x, int64_t x_stride) {
    const int R = static_cast<int>(rows), C = static_cast<int>(cols), ld = static_cast<int>(std::max(leading, cols));
    const int incx = static_cast<int>(x_stride);
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemv(CblasRowMajor, trans, R, C, 1.0f, matrix, ld, x, incx, 0.0f, out, 1);
    } else {
      cblas_dgemv(CblasRowMajor, trans, R, C, 1.0, matrix, ld, x, incx, 0.0, out, 1);
    }
  };
  if (m == 1) {
    // out [n] = b^T x, x = a's one row. b column-major [k, n] is W [n, k] row-major.
    const int64_t x_stride = a.col_major ? a.leading : 1;
    if (b.col_major) {
      run(CblasNoTrans, n, k, b.data, b.leading, a.data, x_stride);
    } else {
      run(CblasTrans, k, n, b.data, b.leading, a.data, x_stride);
    }
  } else {
    // out [m] = a x, x = b's one column. a column-major [m, k] is a row-major [k, m].
    const int64_t x_stride = b.col_major ? 1 : b.leading;
    if (a.col_major) {
      run(CblasTrans, k, m, a.data, a.leading, b.data, x_stride);
    } else {
      run(CblasNoTrans, m, k, a.data, a.leading, b.data, x_stride);
    }
  }
}
#endif

}  // namespace

template <typename T>
void gemm(GemmBackend backend, int64_t m, int64_t n, int64_t k, GemmMatrix<T> a, GemmMatrix<T> b, T* out) {
#if TESSERA_HAVE_BLAS
  if (backend == GemmBackend::blas && fits_blas_int(m, n, k, a.leading, b.leading)) {
    if (m == 1 || n == 1) {
      blas_gemv(m, n, k, a, b, out);
    } else {
      blas_gemm(m, n, k, a, b, out);
    }
    return;
  }
#endif
  eigen_gemm(m, n, k, a, b, out);
}

template void gemm<float>(GemmBackend, int64_t, int64_t, int64_t, GemmMatrix<float>, GemmMatrix<float>, float*);
template void gemm<double>(GemmBackend, int64_t, int64_t, int64_t, GemmMatrix<double>, GemmMatrix<double>, double*);

}  // namespace cpu

}  // namespace tessera
