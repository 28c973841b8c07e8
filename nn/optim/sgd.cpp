// optim::SGD: the fused per-parameter update loop.
#include "nn/optim/sgd.h"

#include "tensor/ops.h"
#include "tensor/parallel.h"

namespace tessera::optim {

namespace {

// p -= lr * d, d = g + wd p, or with momentum buf = m buf + d and
// d = buf (or d + m buf for Nesterov). `first` seeds buf with d.
template <typename T>
void sgd_update(T* param, const T* grad, T* buffer, int64_t count, double lr, double momentum, bool nesterov,
                double weight_decay, bool first) {
  const T step = static_cast<T>(lr), wd = static_cast<T>(weight_decay), mu = static_cast<T>(momentum);
  parallel_for(count, 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T d = grad[i] + wd * param[i];
      if (buffer != nullptr) {
        const T buf = first ? d : mu * buffer[i] + d;
        buffer[i] = buf;
        d = nesterov ? d + mu * buf : buf;
      }
      param[i] -= step * d;
    }
  });
}

}  // namespace

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay, "SGD"), options_(options) {
  TESSERA_CHECK(options_.momentum >= 0.0, "SGD: momentum must be >= 0, got {}", options_.momentum);
  TESSERA_CHECK(!options_.nesterov || options_.momentum > 0.0, "SGD: nesterov needs momentum > 0");
}

SGD::SGD(const std::vector<nn::NamedParameter>& params, SGDOptions options)
    : SGD(std::vector<ParamGroup>{ParamGroup{.params = params, .lr = std::nullopt, .weight_decay = std::nullopt}},
          options) {}

void SGD::init_param_state(const Tensor& param, ParamState& state) const {
  state["step"] = ops::scalar_tensor(0, {.dtype = DType::i64});
  if (options_.momentum > 0.0) state["momentum_buffer"] = ops::zeros_like(param);
}

void SGD::update(Tensor& param, const Tensor& grad, ParamState& state, const ParamGroup& group) {
  Tensor& step_tensor = state.at("step");
  TESSERA_CHECK(step_tensor.dtype() == DType::i64 && step_tensor.numel() == 1 && step_tensor.device().is_cpu(),
                "SGD: state 'step' must be a one-element i64 cpu tensor");
  const bool first = step_tensor.data_ptr<int64_t>()[0]++ == 0;
  Tensor buffer;
  if (options_.momentum > 0.0) {
    buffer = state.at("momentum_buffer");
    TESSERA_CHECK(buffer.is_contiguous() && buffer.dtype() == param.dtype(),
                  "SGD: momentum_buffer must be contiguous and of the parameter's dtype ({})",
                  dtype_name(param.dtype()));
  }
  const double lr = *group.lr, weight_decay = *group.weight_decay;
  if (param.dtype() == DType::f32) {
    sgd_update(param.data_ptr<float>(), grad.data_ptr<float>(), buffer.defined() ? buffer.data_ptr<float>() : nullptr,
               param.numel(), lr, options_.momentum, options_.nesterov, weight_decay, first);
  } else {
    sgd_update(param.data_ptr<double>(), grad.data_ptr<double>(),
               buffer.defined() ? buffer.data_ptr<double>() : nullptr, param.numel(), lr, options_.momentum,
               options_.nesterov, weight_decay, first);
  }
}

}  // namespace tessera::optim
