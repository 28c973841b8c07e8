// gradcheck: the analytic gradient of sum(f(inputs) * w), from the engine,
// against central differences of the same scalar, one input element at a
// time. Inputs are perturbed in place, so strided views are checked as they are.
#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/philox.h"

namespace tessera::autograd {

namespace {

// Logical element `index` of `tensor` as a 0-d view, on any device: read with
// item(), written with fill_ (a cuda input is perturbed through the copy API).
Tensor element_view(const Tensor& tensor, int64_t index) {
  int64_t offset = 0;
  for (int64_t d = tensor.dim() - 1; d >= 0; --d) {
    const int64_t size = tensor.size(d);
    offset += (index % size) * tensor.stride(d);
    index /= size;
  }
  return ops::as_strided(tensor, {}, {}, tensor.storage_offset() + offset);
}

Shape multi_index(const Shape& shape, int64_t index) {
  Shape position(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    position[d] = index % shape[d];
    index /= shape[d];
  }
  return position;
}

double project(const Tensor& output, const std::vector<double>& weights) {
  const std::vector<double> values = output.to_vector<double>();
  double total = 0.0;
  for (size_t i = 0; i < values.size(); ++i) total += values[i] * weights[i];
  return total;
}

constexpr int kMaxReported = 8;

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                          GradcheckOptions options) {
  TensorList wrt;
  std::vector<size_t> wrt_index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TESSERA_CHECK(inputs[i].defined(), "gradcheck: input {} is undefined", i);
    if (!inputs[i].requires_grad()) continue;
    TESSERA_CHECK(inputs[i].dtype() == DType::f64 && !inputs[i].is_meta() && inputs[i].is_leaf(),
                  "gradcheck: input {} must be an f64 leaf on cpu or cuda, got dtype {} on {}", i,
                  dtype_name(inputs[i].dtype()), inputs[i].device().str());
    wrt.push_back(inputs[i]);
    wrt_index.push_back(i);
  }
  TESSERA_CHECK(!wrt.empty(), "gradcheck: no input requires grad, so there is nothing to check");

  const Tensor output = f(inputs);
  TESSERA_CHECK(output.defined() && is_floating(output.dtype()), "gradcheck: f must return a floating tensor");
  std::vector<double> weights(static_cast<size_t>(output.numel()));
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = philox_normal({options.projection_seed, 0}, i);

  TensorList analytic(wrt.size());
  if (output.requires_grad()) {
    const Tensor w = ops::to(ops::from_vector(weights, output.sizes(), {.dtype = output.dtype()}), output.device());
    analytic = grad({output}, wrt, {w});
  }

  GradcheckResult result;
  int reported = 0;
  auto mismatch = [&](const std::string& line) {
    result.ok = false;
    if (reported++ < kMaxReported) result.report += line + "\n";
  };

  // Read every analytic value before any input is perturbed.
  std::vector<std::vector<double>> analytic_values(wrt.size());
  for (size_t k = 0; k < wrt.size(); ++k) {
    analytic_values[k].assign(static_cast<size_t>(wrt[k].numel()), 0.0);
    if (!analytic[k].defined()) continue;
    if (analytic[k].sizes() != wrt[k].sizes() || analytic[k].dtype() != wrt[k].dtype()) {
      mismatch(fmt::format("input {}: gradient has shape {} and dtype {}, input has shape {} and dtype {}",
                           wrt_index[k], analytic[k].sizes(), dtype_name(analytic[k].dtype()), wrt[k].sizes(),
                           dtype_name(wrt[k].dtype())));
      continue;
    }
    analytic_values[k] = analytic[k].to_vector<double>();
  }

  NoGradGuard no_grad;
  for (size_t k = 0; k < wrt.size(); ++k) {
    const Tensor& input = wrt[k];
    const size_t input_nr = wrt_index[k];
    for (int64_t j = 0; j < input.numel(); ++j) {
      Tensor element = element_view(input, j);
      const double original = element.item();
      ops::fill_(element, original + options.eps);
      const double plus = project(f(inputs), weights);
      ops::fill_(element, original - options.eps);
      const double minus = project(f(inputs), weights);
      ops::fill_(element, original);
      const double numeric = (plus - minus) / (2.0 * options.eps);
      const double analytic_value = analytic_values[k][static_cast<size_t>(j)];
      const double error = std::abs(analytic_value - numeric);
      if (!(error <= result.max_abs_error)) result.max_abs_error = std::isnan(error) ? INFINITY : error;
      if (!(error <= options.atol + options.rtol * std::abs(numeric))) {
        mismatch(fmt::format("input {} element {}: analytic {:.8g}, numeric {:.8g}", input_nr,
                             multi_index(input.sizes(), j), analytic_value, numeric));
      }
    }
  }
  if (!result.ok && reported > kMaxReported) {
    result.report += fmt::format("... {} mismatches in all\n", reported);
  }
  return result;
}

}  // namespace tessera::autograd
