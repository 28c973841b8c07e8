// Differentiable views and copies. Each backward maps the gradient of the
// result back onto its input: the same elements in the input's shape, the
// inverse permutation, zeros with the slice filled in, a sum over expanded dims.
#include "autograd/functions.h"
#include "autograd/functions/recording.h"

namespace tessera {

namespace {

using autograd::Node;
using autograd::TensorList;

// view, reshape, flatten, squeeze, unsqueeze: the same elements, another shape.
class ReshapeBackward final : public Node {
 public:
  ReshapeBackward(const char* name, Shape input_shape) : name_(name), input_shape_(std::move(input_shape)) {}
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grads) override { return {ops::reshape(grads[0], input_shape_)}; }

 private:
  const char* name_;
  Shape input_shape_;
};

class PermuteBackward final : public Node {
 public:
  explicit PermuteBackward(std::vector<int64_t> inverse) : inverse_(std::move(inverse)) {}
  std::string name() const override { return "PermuteBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::permute(grads[0], inverse_)}; }

 private:
  std::vector<int64_t> inverse_;
};

class TransposeBackward final : public Node {
 public:
  TransposeBackward(int64_t dim0, int64_t dim1) : dim0_(dim0), dim1_(dim1) {}
  std::string name() const override { return "TransposeBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::transpose(grads[0], dim0_, dim1_)}; }

 private:
  int64_t dim0_, dim1_;
};

// narrow, slice, select: zeros of the input's shape with the gradient copied
// into the part the view selected.
class SliceBackward final : public Node {
 public:
  enum class Kind { narrow, slice, select };
  SliceBackward(Kind kind, const Tensor& input, int64_t dim, int64_t start, int64_t end, int64_t step)
      : kind_(kind), shape_(input.sizes()), dtype_(input.dtype()), device_(input.device()), dim_(dim), start_(start),
        end_(end), step_(step) {}
  std::string name() const override {
    return kind_ == Kind::narrow ? "NarrowBackward" : kind_ == Kind::slice ? "SliceBackward" : "SelectBackward";
  }
  TensorList apply(TensorList&& grads) override {
    Tensor grad_input = ops::zeros(shape_, {.dtype = dtype_, .device = device_});
    Tensor part = kind_ == Kind::narrow  ? ops::narrow(grad_input, dim_, start_, end_)
                  : kind_ == Kind::slice ? ops::slice(grad_input, dim_, start_, end_, step_)
                                         : ops::select(grad_input, dim_, start_);
    ops::copy_(part, grads[0]);
    return {grad_input};
  }

 private:
  Kind kind_;
  Shape shape_;
  DType dtype_;
  Device device_;
  int64_t dim_, start_, end_, step_;  // narrow: end_ is the length; select: start_ is the index
};

class ExpandBackward final : public Node {
 public:
  explicit ExpandBackward(Shape input_shape) : input_shape_(std::move(input_shape)) {}
  std::string name() const override { return "ExpandBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::sum_to_shape(grads[0], input_shape_)}; }

 private:
  Shape input_shape_;
};

// contiguous, clone: the gradient passes through unchanged.
class IdentityBackward final : public Node {
 public:
  explicit IdentityBackward(const char* name) : name_(name) {}
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grads) override { return {std::move(grads[0])}; }

 private:
  const char* name_;
};

class ToDTypeBackward final : public Node {
 public:
  explicit ToDTypeBackward(DType input_dtype) : input_dtype_(input_dtype) {}
  std::string name() const override { return "ToDTypeBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::to(grads[0], input_dtype_)}; }

 private:
  DType input_dtype_;
};

class ToDeviceBackward final : public Node {
 public:
  explicit ToDeviceBackward(Device input_device) : input_device_(input_device) {}
  std::string name() const override { return "ToDeviceBackward"; }
  TensorList apply(TensorList&& grads) override { return {ops::to(grads[0], input_device_)}; }

 private:
  Device input_device_;
};

template <typename NodeType, typename... Args>
Tensor recorded(Tensor y, const Tensor& x, Args&&... args) {
  if (autograd::any_requires_grad({&x})) {
    autograd::record(y, std::make_shared<NodeType>(std::forward<Args>(args)...), {&x});
  }
  return y;
}

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  const GradInputsAllowed recorded_here;
  return recorded<ReshapeBackward>(ops::view(x, shape), x, "ViewBackward", x.sizes());
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  const GradInputsAllowed recorded_here;
  return recorded<ReshapeBackward>(ops::reshape(x, shape), x, "ReshapeBackward", x.sizes());
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  const GradInputsAllowed recorded_here;
  return recorded<ReshapeBackward>(ops::flatten(x, start_dim, end_dim), x, "FlattenBackward", x.sizes());
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::permute(x, dims);  // validates dims
  if (!autograd::any_requires_grad({&x})) return y;
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[wrap_dim(dims[i], x.dim(), "permute")] = static_cast<int64_t>(i);
  return recorded<PermuteBackward>(std::move(y), x, std::move(inverse));
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  const GradInputsAllowed recorded_here;
  return recorded<TransposeBackward>(ops::transpose(x, dim0, dim1), x, dim0, dim1);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  const GradInputsAllowed recorded_here;
  return recorded<SliceBackward>(ops::narrow(x, dim, start, length), x, SliceBackward::Kind::narrow, x, dim, start,
                                 length, 1);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const GradInputsAllowed recorded_here;
  return recorded<SliceBackward>(ops::slice(x, dim, start, end, step), x, SliceBackward::Kind::slice, x, dim, start,
                                 end, step);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  const GradInputsAllowed recorded_here;
  return recorded<SliceBackward>(ops::select(x, dim, index), x, SliceBackward::Kind::select, x, dim, index, 0, 1);
}

Tensor squeeze(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return recorded<ReshapeBackward>(ops::squeeze(x), x, "SqueezeBackward", x.sizes());
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  const GradInputsAllowed recorded_here;
  return recorded<ReshapeBackward>(ops::squeeze(x, dim), x, "SqueezeBackward", x.sizes());
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  const GradInputsAllowed recorded_here;
  return recorded<ReshapeBackward>(ops::unsqueeze(x, dim), x, "UnsqueezeBackward", x.sizes());
}

Tensor expand(const Tensor& x, const Shape& shape) {
  const GradInputsAllowed recorded_here;
  return recorded<ExpandBackward>(ops::expand(x, shape), x, x.sizes());
}

Tensor contiguous(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  if (x.is_contiguous()) return x;
  return recorded<IdentityBackward>(ops::contiguous(x), x, "ContiguousBackward");
}

Tensor clone(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return recorded<IdentityBackward>(ops::clone(x), x, "CloneBackward");
}

Tensor to(const Tensor& x, DType dtype) {
  const GradInputsAllowed recorded_here;
  if (x.dtype() == dtype) return x;
  Tensor y = ops::to(x, dtype);
  if (!is_floating(dtype)) return y;  // integer results carry no gradient
  return recorded<ToDTypeBackward>(std::move(y), x, x.dtype());
}

Tensor to(const Tensor& x, Device device) {
  const GradInputsAllowed recorded_here;
  if (x.device() == device) return x;
  return recorded<ToDeviceBackward>(ops::to(x, device), x, x.device());
}

}  // namespace tessera
