// Dropout on the device: the keep decision at logical index i is the cpu's
// Philox draw at i (tensor/philox.h is one host-device function), so the
// mask and the output are the cpu's bits on any device and any launch shape.
#include "tensor/cuda/dropout.h"

#include "tensor/cuda/kernel_loop.h"
#include "tensor/cuda/portability.h"

namespace tessera::cuda {

namespace {

template <typename T>
__global__ void __launch_bounds__(kThreads) dropout_kernel(T* y, T* mask, const T* x, Layout x_layout, bool x_dense,
                                                          int64_t count, double p, T scale, PhiloxKey key,
                                                          PhiloxNumbering numbering) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const bool keep = philox_uniform(key, numbering.index(i)) >= p;
    const T m = keep ? scale : T(0);
    mask[i] = m;
    y[i] = x[x_dense ? i : x_layout.offset(i)] * m;
  }
}

}  // namespace

void dropout(const Operand& y, const Operand& mask, const Operand& x, double p, double scale, PhiloxKey key,
             PhiloxNumbering numbering, const KernelLaunch& launch) {
  if (y.count == 0) return;
  if (x.dtype == DType::f32) {
    return TESSERA_LAUNCH(dropout_kernel<float>, config_for(y.count, launch), static_cast<float*>(y.data),
                          static_cast<float*>(mask.data), static_cast<const float*>(x.data), x.layout, x.contiguous,
                          y.count, p, static_cast<float>(scale), key, numbering);
  }
  if (x.dtype == DType::f64) {
    return TESSERA_LAUNCH(dropout_kernel<double>, config_for(y.count, launch), static_cast<double*>(y.data),
                          static_cast<double*>(mask.data), static_cast<const double*>(x.data), x.layout,
                          x.contiguous, y.count, p, scale, key, numbering);
  }
  refuse_operands("dropout", "computes in f32 or f64, got", x.dtype);
}

}  // namespace tessera::cuda
