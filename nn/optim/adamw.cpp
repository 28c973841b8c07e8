// optim::AdamW: the fused per-parameter update loop.
#include "nn/optim/adamw.h"

#include <cmath>

#include "tensor/ops.h"
#include "tensor/parallel.h"

namespace tessera::optim {

namespace {

void check_options(const AdamWOptions& options) {
  TESSERA_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0, "AdamW: beta1 must be in [0, 1), got {}", options.beta1);
  TESSERA_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, "AdamW: beta2 must be in [0, 1), got {}", options.beta2);
  TESSERA_CHECK(options.eps >= 0.0, "AdamW: eps must be >= 0, got {}", options.eps);
}

// One pass over [begin, end): decay, both moments, and the parameter.
// 1 - beta comes in from f64: in f32, 1 - float(0.999) is 1.3e-5 off.
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
void adamw_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t count, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step) {
  // Bias corrections folded into two scalars: lr / (1 - b1^t) and 1 / sqrt(1 - b2^t).
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T step_size = static_cast<T>(lr / (1.0 - std::pow(beta1, static_cast<double>(step))));
  const T inv_sqrt_bias2 = static_cast<T>(1.0 / std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
  parallel_for(count, 1 << 15, [&](int64_t begin, int64_t end) {
    adamw_range(param, grad, exp_avg, exp_avg_sq, begin, end, decay, static_cast<T>(beta1), static_cast<T>(beta2),
                static_cast<T>(1.0 - beta1), static_cast<T>(1.0 - beta2), step_size, inv_sqrt_bias2,
                static_cast<T>(eps));
  });
}

}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay, "AdamW"), options_(options) {
  check_options(options_);
}

AdamW::AdamW(const std::vector<nn::NamedParameter>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{.params = params, .lr = std::nullopt, .weight_decay = std::nullopt}},
            options) {}

void AdamW::init_param_state(const Tensor& param, ParamState& state) const {
  state["step"] = ops::scalar_tensor(0, {.dtype = DType::i64});
  state["exp_avg"] = ops::zeros_like(param);
  state["exp_avg_sq"] = ops::zeros_like(param);
}

void AdamW::update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) {
  Tensor& step_tensor = state.at("step");
  Tensor& exp_avg = state.at("exp_avg");
  Tensor& exp_avg_sq = state.at("exp_avg_sq");
  TESSERA_CHECK(step_tensor.dtype() == DType::i64 && step_tensor.numel() == 1 && step_tensor.device().is_cpu(),
                "AdamW: state 'step' must be a one-element i64 cpu tensor");
  TESSERA_CHECK(exp_avg.is_contiguous() && exp_avg_sq.is_contiguous() && exp_avg.dtype() == param.dtype() &&
                    exp_avg_sq.dtype() == param.dtype(),
                "AdamW: moments must be contiguous and of the parameter's dtype ({})", dtype_name(param.dtype()));
  const int64_t step = ++step_tensor.data_ptr<int64_t>()[0];
  const double lr = *group.lr, weight_decay = *group.weight_decay;
  if (param.dtype() == DType::f32) {
    adamw_update(param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                 exp_avg_sq.data_ptr<float>(), param.numel(), lr, options_.beta1, options_.beta2, options_.eps,
                 weight_decay, step);
  } else {
    adamw_update(param.data_ptr<double>(), grad.data_ptr<double>(), exp_avg.data_ptr<double>(),
                 exp_avg_sq.data_ptr<double>(), param.numel(), lr, options_.beta1, options_.beta2, options_.eps,
                 weight_decay, step);
  }
}

}  // namespace tessera::optim
