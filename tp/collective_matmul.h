// Async tensor parallelism without a compiler: the sequence all-gather
// before a column-wise product and the reduce-scatter after a row-wise one,
// cut into batch chunks, so that each chunk's collective runs while the
// GEMM of another computes (on GPUs on the group's stream beside the
// compute stream, ordered by events; on CPU ranks on the communication
// thread beside the rank's own).
//
//   all_gather_linear     x [B, T/tp, K] sequence-sharded -> y [B, T, N]
//   (all_gather_linears:  one gathered x, several weights -> several y):
//                         every chunk's all-gather is issued first; chunk j's
//                         GEMM waits only for its own. Backward: chunk j's
//                         dx GEMM, then its reduce-scatter, which runs while
//                         chunk j + 1's GEMM computes; dW and db over all
//                         tokens at once.
//   linear_reduce_scatter x [B, T, K] -> y [B, T/tp, N] summed over tp:
//                         chunk j's partial product, then its reduce-scatter,
//                         which runs while chunk j + 1's GEMM computes.
//                         Backward: every chunk's all-gather of dy is issued
//                         first; chunk j's dx GEMM waits only for its own.
//
// The chunks split the batch: every element's sum over ranks is in the
// whole collective's order, and dW and db are one GEMM over every token, as
// the synchronous Linear's. Only a chunk's GEMM has fewer rows, for which a
// BLAS may pick another kernel (OpenBLAS's small-matrix path sums in another
// order): the results equal the synchronous layout's within rounding, and
// often bitwise. Bytes are the whole collective's; calls are one per chunk
// (min(chunks, B) chunks or fewer: a batch of one is not split).
#pragma once

#include <cstdint>
#include <vector>

#include "dist/device_mesh.h"
#include "tensor/tensor.h"

namespace tessera::tp {

// How many chunks a batch of `batch` rows is cut into for `chunks`: the
// non-empty ceil-sized pieces (min(chunks, batch) or fewer).
int64_t collective_chunks(int64_t batch, int64_t chunks);

// y = gather(x) W^T + b over the 1-D tp mesh; x: [B, T/tp, K], W: [N, K],
// b: [N] or undefined. Differentiable in x, W and b.
Tensor all_gather_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const dist::DeviceMesh& mesh,
                         int64_t chunks);

// y_i = gather(x) W_i^T + b_i for several weights sharing the gathered input
// (Llama's wq, wk and wv; w1 and w3): one all-gather a chunk, then every
// product of that chunk; backward sums the products' dx before each chunk's
// reduce-scatter. biases: one a weight (undefined for none).
std::vector<Tensor> all_gather_linears(const Tensor& x, const std::vector<Tensor>& weights,
                                       const std::vector<Tensor>& biases, const dist::DeviceMesh& mesh,
                                       int64_t chunks);

// y = reduce_scatter(x W^T) over the 1-D tp mesh, onto the sequence (dim 1);
// x: [B, T, K], W: [N, K]; T divisible by the tp size. Differentiable in x
// and W.
Tensor linear_reduce_scatter(const Tensor& x, const Tensor& weight, const dist::DeviceMesh& mesh, int64_t chunks);

}  // namespace tessera::tp
