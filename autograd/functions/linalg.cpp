// Differentiable matmul and linear. The weight gradient of a batched product
// with a 2-d weight is one GEMM over the flattened batch, not a batch of GEMMs
// summed afterwards.
#include "autograd/functions.h"
#include "autograd/functions/recording.h"

namespace tessera {

namespace {

using autograd::needs_grad;
using autograd::Node;
using autograd::TensorList;

// torch.matmul semantics: a 1-d a is a row [1, K], a 1-d b a column [K, 1];
// batch dims broadcast. With a: [..., M, K], b: [..., K, N], g: [..., M, N]:
//   da = g b^T summed to a's batch shape, db = a^T g summed to b's.
class MatmulBackward final : public Node {
 public:
  MatmulBackward(const Tensor& a, const Tensor& b)
      : a_(b.requires_grad() ? a : Tensor()), b_(a.requires_grad() ? b : Tensor()), a_shape_(a.sizes()),
        b_shape_(b.sizes()), a_dtype_(a.dtype()), b_dtype_(b.dtype()) {}
  std::string name() const override { return "MatmulBackward"; }

  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList result(2);
    if (a_shape_.size() == 1 && b_shape_.size() == 1) {  // dot product: g is 0-d
      if (needs_grad(*this, 0)) result[0] = ops::to(ops::mul(g, b_), a_dtype_);
      if (needs_grad(*this, 1)) result[1] = ops::to(ops::mul(g, a_), b_dtype_);
      return result;
    }
    const Shape a2 = promoted(a_shape_, true);
    const Shape b2 = promoted(b_shape_, false);
    // g with the dims that 1-d operands dropped put back: [..., M, N]
    Shape g_shape = g.sizes();
    if (a_shape_.size() == 1) g_shape.insert(g_shape.end() - 1, 1);
    if (b_shape_.size() == 1) g_shape.push_back(1);
    const Tensor g2 = ops::reshape(g, g_shape);

    if (needs_grad(*this, 0)) {
      Tensor b_t = ops::transpose(ops::reshape(b_, b2), -1, -2);
      result[0] = ops::to(ops::reshape(ops::sum_to_shape(ops::matmul(g2, b_t), a2), a_shape_), a_dtype_);
    }
    if (needs_grad(*this, 1)) result[1] = ops::to(ops::reshape(grad_b(g2, a2, b2), b_shape_), b_dtype_);
    return result;
  }
  void release_saved_tensors() override { a_ = b_ = Tensor(); }

 private:
  static Shape promoted(const Shape& shape, bool is_left) {
    if (shape.size() != 1) return shape;
    return is_left ? Shape{1, shape[0]} : Shape{shape[0], 1};
  }

  // db = a^T g, [K, N] for a 2-d b: one GEMM over all batch rows at once.
  Tensor grad_b(const Tensor& g2, const Shape& a2, const Shape& b2) const {
    const Tensor a = ops::reshape(a_, a2);
    if (b2.size() == 2 && a2.size() > 2) {
      const int64_t k = a2.back();
      Tensor a_rows = ops::reshape(a, {-1, k});              // [B*M, K]
      Tensor g_rows = ops::reshape(g2, {-1, g2.sizes().back()});  // [B*M, N]
      return ops::matmul(ops::transpose(a_rows, 0, 1), g_rows);
    }
    return ops::sum_to_shape(ops::matmul(ops::transpose(a, -1, -2), g2), b2);
  }

  Tensor a_, b_;
  Shape a_shape_, b_shape_;
  DType a_dtype_, b_dtype_;
};

// y = x W^T + b with x: [..., in], W: [out, in], b: [out]. Over the flattened
// rows x2: [R, in], g2: [R, out]:  dx = g W, dW = g2^T x2, db = sum_rows(g2).
class LinearBackward final : public Node {
 public:
  LinearBackward(const Tensor& x, const Tensor& weight, const Tensor& bias)
      : x_(weight.requires_grad() ? x : Tensor()), weight_(x.requires_grad() ? weight : Tensor()),
        x_dtype_(x.dtype()), weight_dtype_(weight.dtype()), bias_dtype_(bias.defined() ? bias.dtype() : x.dtype()) {}
  std::string name() const override { return "LinearBackward"; }

  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList result(3);
    if (needs_grad(*this, 0)) result[0] = ops::to(ops::matmul(g, weight_), x_dtype_);
    if (needs_grad(*this, 1) || needs_grad(*this, 2)) {
      Tensor g_rows = ops::reshape(g, {-1, g.sizes().back()});
      if (needs_grad(*this, 1)) {
        Tensor x_rows = ops::reshape(x_, {-1, x_.sizes().back()});
        result[1] = ops::to(ops::matmul(ops::transpose(g_rows, 0, 1), x_rows), weight_dtype_);
      }
      if (needs_grad(*this, 2)) result[2] = ops::to(ops::sum(g_rows, {0}), bias_dtype_);
    }
    return result;
  }
  void release_saved_tensors() override { x_ = weight_ = Tensor(); }

 private:
  Tensor x_, weight_;
  DType x_dtype_, weight_dtype_, bias_dtype_;
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::matmul(a, b);
  if (autograd::any_requires_grad({&a, &b})) autograd::record(y, std::make_shared<MatmulBackward>(a, b), {&a, &b});
  return y;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::linear(x, weight, bias);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(y, std::make_shared<LinearBackward>(x, weight, bias), {&x, &weight, &bias});
  }
  return y;
}

}  // namespace tessera
