// CPU row-wise kernels over the last dim: softmax/log_softmax, layer/RMS norm
// and cross-entropy, forward and backward. Rows run in parallel; the math of
// one row goes through Eigen arrays, exp through vector_math.h and every sum
// along a row through lane_sum.h (f64, fixed lanes: accurate for long rows and
// the same bits on every machine).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/cpu/dtype_dispatch.h"
#include "tensor/cpu/lane_sum.h"
#include "tensor/cpu/vector_math.h"
#include "tensor/parallel.h"

namespace tessera::cpu {

namespace {

template <typename T>
using Row = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstRow = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// Rows per parallel task: enough elements that a task outweighs its dispatch.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

int64_t last_dim(const Tensor& x) { return x.dim() == 0 ? 1 : x.size(-1); }
int64_t row_count(const Tensor& x) { return last_dim(x) == 0 ? 0 : x.numel() / last_dim(x); }

// Writes softmax (or log_softmax) of `x` into `y`, both of length x.size().
template <typename T>
void softmax_row(Row<T> y, ConstRow<T> x, bool log) {
  const T max = x.maxCoeff();
  vec::exp_shifted(y.data(), x.data(), x.size(), max);
  const double sum = lane_sum(y.data(), y.size());
  if (log) {
    y = (x - max) - static_cast<T>(std::log(sum));
  } else {
    y *= static_cast<T>(1.0 / sum);
  }
}

template <typename T>
void softmax_typed(const Tensor& out, const Tensor& x, bool log) {
  const int64_t cols = last_dim(x), rows = row_count(x);
  const T* in = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) softmax_row<T>(Row<T>(dst + r * cols, cols), ConstRow<T>(in + r * cols, cols), log);
  });
}

template <typename T>
void softmax_backward_typed(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y, bool log) {
  const int64_t cols = last_dim(y), rows = row_count(y);
  const T* g_data = grad_out.data_ptr<T>();
  const T* y_data = y.data_ptr<T>();
  T* dst = grad_in.data_ptr<T>();
  parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const ConstRow<T> g(g_data + r * cols, cols), yr(y_data + r * cols, cols);
      Row<T> dx(dst + r * cols, cols);
      if (log) {
        vec::exp_shifted(dx.data(), yr.data(), cols, T{0});
        dx = g - dx * static_cast<T>(lane_sum(g.data(), cols));  // y = log p: dx = g - p * sum(g)
      } else {
        dx = yr * (g - static_cast<T>(lane_dot(g.data(), yr.data(), cols)));  // dx = p * (g - <g, p>)
      }
    }
  });
}

// y = (x - mean) * rstd * weight + bias per row, writing the row statistics;
// RMS norm (mean undefined) skips the centring. With delta (add_norm), the
// row normalised is x + delta, written to sum first and read back from it.
template <typename T>
void norm_typed(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                const Tensor& bias, double eps, const Tensor& sum = Tensor(), const Tensor& delta = Tensor()) {
  const int64_t cols = last_dim(x), rows = row_count(x);
  const T* x_data = x.data_ptr<T>();
  const T* delta_data = delta.defined() ? delta.data_ptr<T>() : nullptr;
  T* sum_data = delta_data ? sum.data_ptr<T>() : nullptr;
  T* y_data = y.data_ptr<T>();
  T* mean_data = mean.defined() ? mean.data_ptr<T>() : nullptr;
  T* rstd_data = rstd.data_ptr<T>();
  const T* w_data = weight.defined() ? weight.data_ptr<T>() : nullptr;
  const T* b_data = bias.defined() ? bias.data_ptr<T>() : nullptr;
  parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = x_data + r * cols;
      if (delta_data) {
        Row<T>(sum_data + r * cols, cols) = ConstRow<T>(row, cols) + ConstRow<T>(delta_data + r * cols, cols);
        row = sum_data + r * cols;
      }
      const ConstRow<T> xr(row, cols);
      Row<T> yr(y_data + r * cols, cols);
      // Two passes (centre, then square) avoid the cancellation of E[x^2] - E[x]^2.
      const T mu = mean_data ? static_cast<T>(lane_sum(xr.data(), cols) / static_cast<double>(cols)) : T{0};
      yr = xr - mu;
      const double variance = lane_dot(yr.data(), yr.data(), cols) / static_cast<double>(cols);
      const T inv = static_cast<T>(1.0 / std::sqrt(variance + eps));
      yr *= inv;
      if (w_data) yr *= ConstRow<T>(w_data, cols);
      if (b_data) yr += ConstRow<T>(b_data, cols);
      if (mean_data) mean_data[r] = mu;
      rstd_data[r] = inv;
    }
  });
}

// Row blocks for the weight/bias gradient: a fixed split (independent of the
// thread count), each block summed alone, then the blocks in order, so the
// result is the same bits on any number of threads.
constexpr int64_t kMaxRowBlocks = 64;
constexpr int64_t kMinRowsPerBlock = 8;

// With grad_residual (norm_backward_add), each row of grad_x adds it after
// the norm's gradient is stored.
template <typename T>
void norm_backward_typed(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                         const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& grad_residual = Tensor()) {
  const int64_t cols = last_dim(x), rows = row_count(x);
  const T* x_data = x.data_ptr<T>();
  const T* gy_data = grad_y.data_ptr<T>();
  const T* residual_data = grad_residual.defined() ? grad_residual.data_ptr<T>() : nullptr;
  const T* mean_data = mean.defined() ? mean.data_ptr<T>() : nullptr;
  const T* rstd_data = rstd.data_ptr<T>();
  const T* w_data = weight.defined() ? weight.data_ptr<T>() : nullptr;
  T* gx_data = grad_x.defined() ? grad_x.data_ptr<T>() : nullptr;
  const bool want_weight = grad_weight.defined(), want_bias = grad_bias.defined();

  const int64_t blocks = std::clamp<int64_t>((rows + kMinRowsPerBlock - 1) / kMinRowsPerBlock, 1, kMaxRowBlocks);
  // partial[block] = [dweight (cols), dbias (cols)] summed over that block's rows.
  std::vector<T> partial(static_cast<size_t>(blocks * 2 * cols), T{0});
  parallel_for(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    Eigen::Array<T, Eigen::Dynamic, 1> xhat(cols), gw(cols);
    for (int64_t block = block_begin; block < block_end; ++block) {
      Row<T> dweight(partial.data() + block * 2 * cols, cols), dbias(partial.data() + block * 2 * cols + cols, cols);
      for (int64_t r = rows * block / blocks; r < rows * (block + 1) / blocks; ++r) {
        // xhat = (x - mean) * rstd; gw = dy * weight;
        // dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))  (no mean(gw) term for RMS norm).
        const ConstRow<T> xr(x_data + r * cols, cols), gy(gy_data + r * cols, cols);
        const T inv = rstd_data[r];
        xhat = (xr - (mean_data ? mean_data[r] : T{0})) * inv;
        if (want_weight) dweight += gy * xhat;
        if (want_bias) dbias += gy;
        if (!gx_data) continue;
        if (w_data) {
          gw = gy * ConstRow<T>(w_data, cols);
        } else {
          gw = gy;
        }
        const auto n = static_cast<double>(cols);
        const T gw_mean = mean_data ? static_cast<T>(lane_sum(gw.data(), cols) / n) : T{0};
        const T proj = static_cast<T>(lane_dot(gw.data(), xhat.data(), cols) / n);
        Row<T> dx(gx_data + r * cols, cols);
        dx = inv * (gw - gw_mean - xhat * proj);
        if (residual_data) dx += ConstRow<T>(residual_data + r * cols, cols);
      }
    }
  });
  if (want_weight) {
    Row<T> dweight(grad_weight.data_ptr<T>(), cols);
    dweight.setZero();
    for (int64_t block = 0; block < blocks; ++block) dweight += Row<T>(partial.data() + block * 2 * cols, cols);
  }
  if (want_bias) {
    Row<T> dbias(grad_bias.data_ptr<T>(), cols);
    dbias.setZero();
    for (int64_t block = 0; block < blocks; ++block) dbias += Row<T>(partial.data() + block * 2 * cols + cols, cols);
  }
}

// Each row's target, -1 where the row is ignored (the op checked the rest are in range).
std::vector<int64_t> row_targets(const Tensor& targets, int64_t ignore_index) {
  std::vector<int64_t> result = targets.to_vector<int64_t>();
  for (int64_t& t : result) t = t == ignore_index ? -1 : t;
  return result;
}

int64_t kept_rows(const std::vector<int64_t>& targets) {
  return std::count_if(targets.begin(), targets.end(), [](int64_t t) { return t >= 0; });
}

template <typename T>
void cross_entropy_typed(const Tensor& loss, const Tensor& logsumexp, const Tensor& logits, const Tensor& targets,
                         int64_t ignore_index, int64_t classes) {
  const int64_t rows = logits.size(0), pitch = logits.size(1), cols = classes;
  const T* data = logits.data_ptr<T>();
  T* lse_data = logsumexp.data_ptr<T>();
  const std::vector<int64_t> target = row_targets(targets, ignore_index);
  std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
  parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    Eigen::Array<T, Eigen::Dynamic, 1> shifted_exp(cols);  // one row's exp(x - max)
    for (int64_t r = begin; r < end; ++r) {
      const ConstRow<T> x(data + r * pitch, cols);
      const T max = cols > 0 ? x.maxCoeff() : -std::numeric_limits<T>::infinity();
      vec::exp_shifted(shifted_exp.data(), x.data(), cols, max);
      const double row_logsumexp = static_cast<double>(max) + std::log(lane_sum(shifted_exp.data(), cols));
      lse_data[r] = static_cast<T>(row_logsumexp);  // every row's, for the backward
      const int64_t t = target[static_cast<size_t>(r)];
      if (t >= 0) row_loss[static_cast<size_t>(r)] = row_logsumexp - static_cast<double>(x[t]);
    }
  });
  double total = 0.0;  // summed in row order: the same bits on any thread count
  for (double value : row_loss) total += value;
  // No kept rows: 0/0 = NaN, as torch's mean reduction gives.
  const auto kept = static_cast<double>(kept_rows(target));
  loss.data_ptr<T>()[0] = static_cast<T>(kept > 0 ? total / kept : std::numeric_limits<double>::quiet_NaN());
}

// dx = scale (exp(x - logsumexp) - onehot(t)): the forward's logsumexp, so
// the logits are read once. Padding columns (from `classes` on) get zero.
template <typename T>
void cross_entropy_backward_typed(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                                  const Tensor& logsumexp, const Tensor& targets, int64_t ignore_index,
                                  int64_t classes) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const T* data = logits.data_ptr<T>();
  const T* lse_data = logsumexp.data_ptr<T>();
  T* dst = grad_logits.data_ptr<T>();
  const std::vector<int64_t> target = row_targets(targets, ignore_index);
  const int64_t kept = kept_rows(target);
  const T scale = kept > 0 ? static_cast<T>(grad_loss.item() / static_cast<double>(kept)) : T{0};
  parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      Row<T> row(dst + r * cols, cols);
      const int64_t t = target[static_cast<size_t>(r)];
      if (t < 0) {
        row.setZero();
        continue;
      }
      row.tail(cols - classes).setZero();
      auto dx = row.head(classes);
      vec::exp_shifted(dx.data(), data + r * cols, classes, lse_data[r]);
      dx *= scale;
      dx[t] -= scale;
    }
  });
}

}  // namespace

void softmax(const Tensor& out, const Tensor& x, bool log) {
  visit_float_dtype(x.dtype(), "softmax", [&]<typename T>(T) { softmax_typed<T>(out, x, log); });
}

void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y, bool log) {
  visit_float_dtype(y.dtype(), "softmax_backward",
                 [&]<typename T>(T) { softmax_backward_typed<T>(grad_in, grad_out, y, log); });
}

void norm(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
          const Tensor& bias, double eps) {
  visit_float_dtype(x.dtype(), "norm", [&]<typename T>(T) { norm_typed<T>(y, mean, rstd, x, weight, bias, eps); });
}

void norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                   const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  visit_float_dtype(x.dtype(), "norm_backward", [&]<typename T>(T) {
    norm_backward_typed<T>(grad_x, grad_weight, grad_bias, grad_y, x, weight, mean, rstd);
  });
}

void add_norm(const Tensor& sum, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
              const Tensor& delta, const Tensor& weight, const Tensor& bias, double eps) {
  visit_float_dtype(x.dtype(), "add_norm",
                    [&]<typename T>(T) { norm_typed<T>(y, mean, rstd, x, weight, bias, eps, sum, delta); });
}

void norm_backward_add(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                       const Tensor& grad_residual, const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd) {
  visit_float_dtype(x.dtype(), "norm_backward_add", [&]<typename T>(T) {
    norm_backward_typed<T>(grad_x, grad_weight, grad_bias, grad_y, x, weight, mean, rstd, grad_residual);
  });
}

void cross_entropy(const Tensor& loss, const Tensor& logsumexp, const Tensor& logits, const Tensor& targets,
                   int64_t ignore_index, int64_t classes) {
  visit_float_dtype(logits.dtype(), "cross_entropy", [&]<typename T>(T) {
    cross_entropy_typed<T>(loss, logsumexp, logits, targets, ignore_index, classes);
  });
}

void cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                            const Tensor& logsumexp, const Tensor& targets, int64_t ignore_index, int64_t classes) {
  visit_float_dtype(logits.dtype(), "cross_entropy_backward", [&]<typename T>(T) {
    cross_entropy_backward_typed<T>(grad_logits, grad_loss, logits, logsumexp, targets, ignore_index, classes);
  });
}

}  // namespace tessera::cpu
