// Differentiable reductions. The gradient of a reduced tensor is reshaped to
// keep the reduced dims (size 1) and broadcast back over them: sum copies it,
// mean also divides by the count, amax and max route it to the maxima.
#include "autograd/functions.h"
#include "autograd/functions/recording.h"

namespace tessera {

namespace {

using autograd::Node;
using autograd::TensorList;

// The input's shape with the reduced dims set to 1 (all dims when none given).
Shape kept_shape(const Shape& shape, const std::vector<int64_t>& dims, const char* op) {
  Shape kept = shape;
  if (shape.empty()) return kept;  // a 0-d tensor reduces to itself
  if (dims.empty()) {
    std::fill(kept.begin(), kept.end(), 1);
    return kept;
  }
  for (int64_t dim : dims) kept[wrap_dim(dim, static_cast<int64_t>(shape.size()), op)] = 1;
  return kept;
}

// sum: g broadcast back; mean: g / count broadcast back.
class SumBackward final : public Node {
 public:
  SumBackward(const char* name, Shape input_shape, Shape kept, double scale)
      : name_(name), input_shape_(std::move(input_shape)), kept_(std::move(kept)), scale_(scale) {}
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grads) override {
    Tensor g = ops::reshape(grads[0], kept_);
    if (scale_ != 1.0) g = ops::mul(g, scale_);
    return {ops::expand(g, input_shape_)};
  }

 private:
  const char* name_;
  Shape input_shape_;
  Shape kept_;
  double scale_;
};

// amax: the gradient is shared equally among the elements equal to the
// maximum (as torch.amax does), so ties split it instead of one taking all.
class AmaxBackward final : public Node {
 public:
  AmaxBackward(const Tensor& x, Tensor y_kept, std::vector<int64_t> dims, Shape kept)
      : x_(x), y_kept_(std::move(y_kept)), dims_(std::move(dims)), kept_(std::move(kept)) {}
  std::string name() const override { return "AmaxBackward"; }
  TensorList apply(TensorList&& grads) override {
    // x: [..., n, ...], y_kept and g: [..., 1, ...]
    Tensor is_max = ops::to(ops::eq(x_, y_kept_), x_.dtype());
    Tensor count = ops::sum(is_max, dims_, true);
    Tensor share = ops::div(ops::reshape(grads[0], kept_), count);
    return {ops::mul(is_max, share)};
  }
  void release_saved_tensors() override { x_ = y_kept_ = Tensor(); }

 private:
  Tensor x_, y_kept_;
  std::vector<int64_t> dims_;
  Shape kept_;
};

// max along a dim: the whole gradient goes to the first maximum (the index
// that max returns).
class MaxBackward final : public Node {
 public:
  MaxBackward(const Tensor& x, int64_t dim, Tensor indices_kept)
      : input_shape_(x.sizes()), dim_(dim), indices_kept_(std::move(indices_kept)) {}
  std::string name() const override { return "MaxBackward"; }
  TensorList apply(TensorList&& grads) override {
    // positions: [1, ..., n, ..., 1] with 0..n-1 along dim; indices_kept: [..., 1, ...]
    const int64_t size = input_shape_.empty() ? 1 : input_shape_[dim_];
    Shape line(input_shape_.size(), 1);
    if (!line.empty()) line[dim_] = size;
    Tensor positions = ops::reshape(
        ops::arange(0.0, static_cast<double>(size), 1.0, {.dtype = DType::i64, .device = indices_kept_.device()}), line);
    Tensor is_argmax = ops::eq(positions, indices_kept_);
    Tensor g = ops::reshape(grads[0], indices_kept_.sizes());
    Tensor zero = ops::scalar_tensor(0.0, {.dtype = g.dtype(), .device = g.device()});
    return {ops::where(is_argmax, g, zero)};
  }
  void release_saved_tensors() override { indices_kept_ = Tensor(); }

 private:
  Shape input_shape_;
  int64_t dim_;
  Tensor indices_kept_;
};

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::sum(x, dims, keepdim);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(y, std::make_shared<SumBackward>("SumBackward", x.sizes(), kept_shape(x.sizes(), dims, "sum"), 1.0),
                     {&x});
  }
  return y;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::mean(x, dims, keepdim);
  if (autograd::any_requires_grad({&x})) {
    Shape kept = kept_shape(x.sizes(), dims, "mean");
    const int64_t count = x.numel() / std::max<int64_t>(shape_numel(kept), 1);
    autograd::record(y, std::make_shared<SumBackward>("MeanBackward", x.sizes(), std::move(kept), 1.0 / count), {&x});
  }
  return y;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::amax(x, dims, keepdim);
  if (autograd::any_requires_grad({&x})) {
    Shape kept = kept_shape(x.sizes(), dims, "amax");
    Tensor y_kept = ops::reshape(y.detach(), kept);
    autograd::record(y, std::make_shared<AmaxBackward>(x, std::move(y_kept), dims, std::move(kept)), {&x});
  }
  return y;
}

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  const GradInputsAllowed recorded_here;
  auto [values, indices] = ops::max(x, dim, keepdim);
  if (autograd::any_requires_grad({&x})) {
    const int64_t wrapped = wrap_dim(dim, x.dim(), "max");
    Tensor indices_kept = ops::reshape(indices, kept_shape(x.sizes(), {wrapped}, "max"));
    autograd::record(values, std::make_shared<MaxBackward>(x, wrapped, std::move(indices_kept)), {&x});
  }
  return {values, indices};
}

}  // namespace tessera
