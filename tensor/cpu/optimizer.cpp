// CPU kernels of the optimizer step: the fused AdamW loop (one pass per
// tensor, split across threads, no temporaries), and the f64 sum of squares
// and the scale of clip_grad_norm_. These are the reference the cuda kernels
// (tensor/cuda/optimizer.cu) are tested against.
#include <algorithm>
#include <cmath>

#include "tensor/cpu/cpu_kernels.h"
#include "tensor/element_conversion.h"
#include "tensor/parallel.h"

namespace tessera::cpu {

namespace {

// Clip's blocks: summed one after another, so the total does not depend on
// the thread count.
constexpr int64_t kSquaresBlock = 1 << 15;

// One pass over [begin, end): decay, both moments, and the parameter.
template <typename T>
void adamw_range(T* __restrict param, const T* __restrict grad, T* __restrict exp_avg, T* __restrict exp_avg_sq,
                 int64_t begin, int64_t end, T decay, T beta1, T beta2, T one_minus_beta1, T one_minus_beta2,
                 T step_size, T inv_sqrt_bias2, T eps) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const T g = grad[i];
    const T m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const T v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = param[i] * decay - step_size * m / (std::sqrt(v) * inv_sqrt_bias2 + eps);
  }
}

template <typename T>
void adamw_tensor(const AdamWTensor& tensor, const AdamWMoments& moments) {
  T* param = tensor.param.data_ptr<T>();
  const T* grad = tensor.grad.data_ptr<T>();
  T* exp_avg = tensor.exp_avg.data_ptr<T>();
  T* exp_avg_sq = tensor.exp_avg_sq.data_ptr<T>();
  BFloat16* working = tensor.working_copy.defined() ? tensor.working_copy.data_ptr<BFloat16>() : nullptr;
  parallel_for(tensor.param.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    adamw_range(param, grad, exp_avg, exp_avg_sq, begin, end, static_cast<T>(tensor.decay),
                static_cast<T>(moments.beta1), static_cast<T>(moments.beta2), static_cast<T>(1.0 - moments.beta1),
                static_cast<T>(1.0 - moments.beta2), static_cast<T>(tensor.step_size),
                static_cast<T>(tensor.inv_sqrt_bias2), static_cast<T>(moments.eps));
    if (working != nullptr) {
      for (int64_t i = begin; i < end; ++i) working[i] = convert<BFloat16>(param[i]);
    }
  });
}

template <typename T>
double squares_of(const T* data, int64_t count) {
  const int64_t blocks = (count + kSquaresBlock - 1) / kSquaresBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kSquaresBlock, last = std::min(count, first + kSquaresBlock);
      double sum = 0.0;
      for (int64_t i = first; i < last; ++i) sum += static_cast<double>(data[i]) * static_cast<double>(data[i]);
      partial[static_cast<size_t>(b)] = sum;
    }
  });
  double total = 0.0;
  for (double value : partial) total += value;
  return total;
}

void check_float_contiguous(const char* kernel, const Tensor& tensor) {
  TESSERA_CHECK((tensor.dtype() == DType::f32 || tensor.dtype() == DType::f64) && tensor.is_contiguous(),
                "cpu::{}: expects contiguous f32 or f64 tensors, got {} {}", kernel, dtype_name(tensor.dtype()),
                tensor.sizes());
}

}  // namespace

void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWMoments& moments) {
  for (const AdamWTensor& tensor : tensors) {
    check_float_contiguous("adamw_step", tensor.param);
    if (tensor.param.dtype() == DType::f32) {
      adamw_tensor<float>(tensor, moments);
    } else {
      adamw_tensor<double>(tensor, moments);
    }
  }
}

void sum_of_squares(const Tensor& total, const std::vector<Tensor>& tensors) {
  double sum = 0.0;
  for (const Tensor& tensor : tensors) {
    check_float_contiguous("sum_of_squares", tensor);
    sum += tensor.dtype() == DType::f32 ? squares_of(tensor.data_ptr<float>(), tensor.numel())
                                        : squares_of(tensor.data_ptr<double>(), tensor.numel());
  }
  total.data_ptr<double>()[0] = sum;
}

void scale_to_max_norm(const std::vector<Tensor>& tensors, const Tensor& total, double max_norm) {
  const double norm = std::sqrt(total.data_ptr<double>()[0]);
  const double coefficient = max_norm / (norm + 1e-6);
  if (!std::isfinite(norm) || !(coefficient < 1.0)) return;
  for (const Tensor& tensor : tensors) {
    check_float_contiguous("scale_to_max_norm", tensor);
    visit_dtype(tensor.dtype(), [&]<typename T>(T) {
      if constexpr (std::is_floating_point_v<T>) {
        T* data = tensor.data_ptr<T>();
        const T factor = static_cast<T>(coefficient);
        parallel_for(tensor.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) data[i] = data[i] * factor;
        });
      }
    });
  }
}

}  // namespace tessera::cpu
