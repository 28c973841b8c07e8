// Which library multiplies matrices on the CPU. Eigen is always built in;
// an optimised BLAS (OpenBLAS built with OpenMP, from Debian's
// libopenblas-openmp-dev) is when meson finds it (-Dblas=auto|enabled|disabled),
// and is then the default: 1.2-1.8x Eigen's GEMM rate here (bench/matmul).
// TESSERA_GEMM=eigen|blas in the environment, or set_gemm_backend(), chooses.
//
// Both run on tessera's OpenMP team (the calling thread's set_num_threads;
// single-threaded inside a parallel region), so neither oversubscribes. For
// a fixed backend, machine and thread count every product is bitwise
// reproducible; the two backends sum in different orders, so they agree
// only within rounding (tests compare within their stated tolerances).
#pragma once

#include <string>
#include <string_view>

namespace tessera {

enum class GemmBackend { eigen, blas };

// The backend matmuls use: set_gemm_backend's, else TESSERA_GEMM's (read
// once; an unknown value throws tessera::Error naming it), else blas when
// built in, else eigen.
GemmBackend gemm_backend();
// Throws tessera::Error when `backend` is not built in.
void set_gemm_backend(GemmBackend backend);
bool gemm_backend_built(GemmBackend backend);
const char* gemm_backend_name(GemmBackend backend);  // "eigen", "blas"
// The backend called `name` ("eigen" or "blas", as TESSERA_GEMM takes it);
// throws tessera::Error for another name, or for one not built in.
GemmBackend gemm_backend_named(std::string_view name);
// The library behind the current backend, for banners and benchmarks:
// "OpenBLAS 0.3.21 (OpenMP, SkylakeX kernels)" or "Eigen 3.4.0".
std::string gemm_description();

}  // namespace tessera
