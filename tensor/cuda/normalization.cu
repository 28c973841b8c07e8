// Layer norm and RMS norm on the device, forward and backward: a row per
// group of threads (row_group.h), read once into registers (rows up to
// kNormMaxColumns, 4096), the statistics by fixed trees in the arithmetic
// type (f32 for f32 and bf16 rows, f64 for f64 ones). The formulas are the cpu's
// (tensor/cpu/normalization.cpp): two passes over the registers (centre, then
// square) for the variance, and
//   xhat = (x - mean) rstd,  gw = dy weight,
//   dx = rstd (gw - mean(gw) - xhat mean(gw xhat))   (no mean(gw) for RMS norm).
// A group takes kRowsPerGroup rows or more (twice that in the backward), so
// it loads the weight and bias once for many rows; in the backward it also
// sums its rows' weight and bias gradients in registers, the block's groups
// add theirs in group order into a per-block partial, and a last kernel adds
// the blocks' partials, 32 threads a column, each in block order, then a
// fixed tree: no float atomics, the same bits on every run.
// The residual-add variants (kAdd) are these kernels with two more
// operands: the forward adds delta to its row as it loads it (rounded to T,
// as the elementwise add rounds it) and writes that sum; the backward adds a
// residual gradient to dx after dx rounds, as the autograd engine's add of
// the two gradients would. kAdd is a template argument so that the plain
// kernels keep their registers (a runtime branch cost the bf16 backward at
// 512 threads 21 more on sm_90: one block a multiprocessor instead of two).
#include "tensor/cuda/normalization.h"

#include "tensor/cuda/portability.h"
#include "tensor/cuda/row_group.h"

namespace tessera::cuda {

namespace {

// Rows a group takes at least: the forward re-reads the weight and bias once
// per group, the backward also writes and re-reads a partial per block, so it
// takes twice as many (each at most ~3% of the ideal bytes at [256, 768]).
// Loading a group's next row while it reduces this one was tried (d045b3d)
// and measured on an H100 at [16384, 768], bf16: the forward went from 1.05
// to 1.85 ms a GPT-2 step, the backward from 2.47 to 2.62 ms; reverted.
constexpr int64_t kRowsPerGroup = 16;
constexpr int64_t kBackwardRowsPerGroup = 32;

int64_t group_count(int64_t rows, int64_t rows_per_group) { return (rows + rows_per_group - 1) / rows_per_group; }

template <typename T, int kGroupThreads, int kPerThread, bool kAdd>
__global__ void __launch_bounds__(RowGroup<kGroupThreads>::kBlockThreads)
    norm_kernel(T* y, Accumulator<T>* mean, Accumulator<T>* rstd, T* sum, const T* x, const T* delta,
                const T* weight, const T* bias, int64_t rows, int64_t cols, Accumulator<T> eps) {
  using Group = RowGroup<kGroupThreads>;
  using A = Accumulator<T>;
  const int lane = Group::lane();
  const RowSlice<T, kGroupThreads, kPerThread> w(weight, cols, lane), b(bias, cols, lane);
  const A n = static_cast<A>(cols);
  for (int64_t row = Group::first(); row < rows; row += Group::stride()) {
    RowSlice<T, kGroupThreads, kPerThread> slice(x + row * cols, cols, lane);
    if constexpr (kAdd) slice.add_rounded(delta + row * cols, sum + row * cols);
    A mu = 0;
    if (mean != nullptr) {
      A total = 0;
      slice.for_each([&](int, int64_t, A value) { total += value; });
      mu = Group::all_reduce(total, Plus{}) / n;
    }
    A squares = 0;
    slice.for_each([&](int, int64_t, A value) { squares += (value - mu) * (value - mu); });
    const A inverse = A(1) / std::sqrt(Group::all_reduce(squares, Plus{}) / n + eps);
    T* out = y + row * cols;
    slice.for_each([&](int i, int64_t col, A value) {
      A result = (value - mu) * inverse;
      if (weight != nullptr) result *= w.at(i, col);
      if (bias != nullptr) result += b.at(i, col);
      out[col] = convert<T>(result);
    });
    if (lane == 0) {
      if (mean != nullptr) mean[row] = mu;
      rstd[row] = inverse;
    }
  }
}

template <typename T, int kGroupThreads, int kPerThread, bool kAdd>
__global__ void __launch_bounds__(RowGroup<kGroupThreads>::kBlockThreads)
    norm_backward_kernel(T* grad_x, Accumulator<T>* partials, const T* grad_residual, const T* grad_y, const T* x,
                         const T* weight, const Accumulator<T>* mean, const Accumulator<T>* rstd, int64_t rows,
                         int64_t cols) {
  using Group = RowGroup<kGroupThreads>;
  using A = Accumulator<T>;
  const int lane = Group::lane();
  const RowSlice<T, kGroupThreads, kPerThread> w(weight, cols, lane);
  const A n = static_cast<A>(cols);
  A dweight[kPerThread] = {}, dbias[kPerThread] = {};
  for (int64_t row = Group::first(); row < rows; row += Group::stride()) {
    const RowSlice<T, kGroupThreads, kPerThread> xs(x + row * cols, cols, lane), dy(grad_y + row * cols, cols, lane);
    const A inverse = Group::from_lane0(lane == 0 ? rstd[row] : A(0));
    const A mu = mean != nullptr ? Group::from_lane0(lane == 0 ? mean[row] : A(0)) : A(0);
    A sum_gw = 0, sum_gw_xhat = 0;
    xs.for_each([&](int i, int64_t col, A value) {
      const A xhat = (value - mu) * inverse;
      const A g = dy.at(i, col);
      dweight[i] += g * xhat;
      dbias[i] += g;
      const A gw = weight != nullptr ? g * w.at(i, col) : g;
      sum_gw += gw;
      sum_gw_xhat += gw * xhat;
    });
    const A gw_mean = mean != nullptr ? Group::all_reduce(sum_gw, Plus{}) / n : A(0);
    const A projection = Group::all_reduce(sum_gw_xhat, Plus{}) / n;
    if (grad_x == nullptr) continue;
    T* dx = grad_x + row * cols;
    // Without kAdd a row of no data: nothing loaded, nothing kept.
    const RowSlice<T, kGroupThreads, kPerThread> residual(kAdd ? grad_residual + row * cols : nullptr, cols, lane);
    xs.for_each([&](int i, int64_t col, A value) {
      const A xhat = (value - mu) * inverse;
      const A gw = weight != nullptr ? dy.at(i, col) * w.at(i, col) : dy.at(i, col);
      const T norm_grad = convert<T>(inverse * (gw - gw_mean - xhat * projection));
      if constexpr (kAdd) {
        dx[col] = convert<T>(convert<A>(norm_grad) + residual.at(i, col));
      } else {
        dx[col] = norm_grad;
      }
    });
  }
  if (partials == nullptr) return;
  // partials[block] = [dweight (cols), dbias (cols)] of this block's rows.
  A* block_partial = partials + static_cast<int64_t>(blockIdx.x) * 2 * cols;
  if constexpr (Group::kPerBlock == 1) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t col = lane + static_cast<int64_t>(i) * kGroupThreads;
      if (col >= cols) continue;
      block_partial[col] = dweight[i];
      block_partial[cols + col] = dbias[i];
    }
  } else {
    __shared__ A combined[2][kGroupThreads * kPerThread];
    for (int group = 0; group < Group::kPerBlock; ++group) {
      if (Group::in_block() == group) {
#pragma unroll
        for (int i = 0; i < kPerThread; ++i) {
          const int col = lane + i * kGroupThreads;
          combined[0][col] = (group == 0 ? A(0) : combined[0][col]) + dweight[i];
          combined[1][col] = (group == 0 ? A(0) : combined[1][col]) + dbias[i];
        }
      }
      __syncthreads();
    }
    for (int64_t col = threadIdx.x; col < cols; col += blockDim.x) {
      block_partial[col] = combined[0][col];
      block_partial[cols + col] = combined[1][col];
    }
  }
}

// The partials' sum: a block takes kGradColumns adjacent partial columns
// (8 f32 are one 32-byte sector) with kGradParts threads on each; thread p
// adds blocks p, p + 32, ... in block order, then a fixed tree adds the 32
// parts. Partial column j is grad_weight[j] for j < cols, else
// grad_bias[j - cols]; the launch covers columns [first_column, end_column).
constexpr int kGradColumns = 8;
constexpr int kGradParts = kThreads / kGradColumns;

template <typename T>
__global__ void __launch_bounds__(kThreads) norm_parameter_grads_kernel(T* grad_weight, T* grad_bias,
                                                                         const Accumulator<T>* partials,
                                                                         int64_t blocks, int64_t cols,
                                                                         int64_t first_column, int64_t end_column) {
  using A = Accumulator<T>;
  __shared__ A part_sums[kGradParts][kGradColumns];
  const int lane = static_cast<int>(threadIdx.x) % kGradColumns;
  const int part = static_cast<int>(threadIdx.x) / kGradColumns;
  const int64_t column = first_column + static_cast<int64_t>(blockIdx.x) * kGradColumns + lane;
  A sum = 0;
  if (column < end_column) {
    const A* partial = partials + column;
    const int64_t row_stride = 2 * cols;
    int64_t block = part;
    // Four blocks' loads in flight before they are added, in block order.
    for (; block + 3 * kGradParts < blocks; block += 4 * kGradParts) {
      A values[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) values[k] = partial[(block + k * kGradParts) * row_stride];
#pragma unroll
      for (int k = 0; k < 4; ++k) sum += values[k];
    }
    for (; block < blocks; block += kGradParts) sum += partial[block * row_stride];
  }
  part_sums[part][lane] = sum;
  __syncthreads();
  for (int stride = kGradParts / 2; stride > 0; stride /= 2) {
    if (part < stride) part_sums[part][lane] += part_sums[part + stride][lane];
    __syncthreads();
  }
  if (part != 0 || column >= end_column) return;
  if (column < cols) {
    grad_weight[column] = convert<T>(part_sums[0][lane]);
  } else {
    grad_bias[column - cols] = convert<T>(part_sums[0][lane]);
  }
}

// The blocks the row kernels of a [rows, cols] norm launch.
int64_t norm_blocks(int64_t rows, int64_t cols) {
  int64_t blocks = 0;
  visit_row_shape(cols, [&]<int kGroupThreads, int kPerThread>() {
    blocks = row_config<kGroupThreads>(group_count(rows, kBackwardRowsPerGroup), KernelLaunch{}).grid.x;
  });
  return blocks;
}

template <typename T>
T* typed(const Operand& operand) {
  return static_cast<T*>(operand.data);
}

// Calls fn.template operator()<kAdd>() with kAdd = whether the op has the
// residual-add operand `addend` (delta, or grad_residual).
template <typename Fn>
void visit_add(const Operand& addend, Fn&& fn) {
  if (addend.data != nullptr) return fn.template operator()<true>();
  return fn.template operator()<false>();
}

}  // namespace

void norm(const Operand& y, const Operand& mean, const Operand& rstd, const Operand& sum, const Operand& x,
          const Operand& delta, const Operand& weight, const Operand& bias, double eps, int64_t rows, int64_t cols,
          const KernelLaunch& launch) {
  if (rows == 0 || cols == 0) return;
  visit_row_dtype(x.dtype, "norm", [&]<typename T>(T) {
    using A = Accumulator<T>;
    visit_row_shape(cols, [&]<int kGroupThreads, int kPerThread>() {
      if constexpr (kPerThread > 0 && kGroupThreads * kPerThread <= kNormMaxColumns) {
        visit_add(delta, [&]<bool kAdd>() {
          TESSERA_LAUNCH((norm_kernel<T, kGroupThreads, kPerThread, kAdd>),
                         row_config<kGroupThreads>(group_count(rows, kRowsPerGroup), launch), typed<T>(y),
                         typed<A>(mean), typed<A>(rstd), typed<T>(sum), typed<const T>(x), typed<const T>(delta),
                         typed<const T>(weight), typed<const T>(bias), rows, cols, static_cast<A>(eps));
        });
      } else {
        refuse_operands("norm", "rows longer than kNormMaxColumns (4096) columns, dtype", x.dtype);
      }
    });
  });
}

int64_t norm_backward_workspace_elements(int64_t rows, int64_t cols) { return norm_blocks(rows, cols) * 2 * cols; }

void norm_backward(const Operand& grad_x, const Operand& grad_weight, const Operand& grad_bias,
                   const Operand& workspace, const Operand& grad_residual, const Operand& grad_y, const Operand& x,
                   const Operand& weight, const Operand& mean, const Operand& rstd, int64_t rows, int64_t cols,
                   const KernelLaunch& launch) {
  if (cols == 0) return;
  visit_row_dtype(x.dtype, "norm_backward", [&]<typename T>(T) {
    using A = Accumulator<T>;
    visit_row_shape(cols, [&]<int kGroupThreads, int kPerThread>() {
      if constexpr (kPerThread > 0 && kGroupThreads * kPerThread <= kNormMaxColumns) {
        if (rows > 0) {
          visit_add(grad_residual, [&]<bool kAdd>() {
            TESSERA_LAUNCH((norm_backward_kernel<T, kGroupThreads, kPerThread, kAdd>),
                           row_config<kGroupThreads>(group_count(rows, kBackwardRowsPerGroup), launch),
                           typed<T>(grad_x), typed<A>(workspace), typed<const T>(grad_residual),
                           typed<const T>(grad_y), typed<const T>(x), typed<const T>(weight), typed<const A>(mean),
                           typed<const A>(rstd), rows, cols);
          });
        }
      } else {
        refuse_operands("norm_backward", "rows longer than kNormMaxColumns (4096) columns, dtype", x.dtype);
      }
    });
    if (grad_weight.data == nullptr && grad_bias.data == nullptr) return;
    const int64_t first_column = grad_weight.data != nullptr ? 0 : cols;
    const int64_t end_column = grad_bias.data != nullptr ? 2 * cols : cols;
    LaunchConfig config = config_for(1, launch);
    config.grid = dim3(static_cast<unsigned>((end_column - first_column + kGradColumns - 1) / kGradColumns));
    TESSERA_LAUNCH(norm_parameter_grads_kernel<T>, config, typed<T>(grad_weight), typed<T>(grad_bias),
                   typed<const A>(workspace), rows > 0 ? norm_blocks(rows, cols) : 0, cols, first_column, end_column);
  });
}

}  // namespace tessera::cuda
