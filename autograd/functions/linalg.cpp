// Differentiable matmul, linear and linear_gelu_linear (the GELU MLP core).
// The weight gradient of a batched product with a 2-d weight is one GEMM over
// the flattened batch, not a batch of GEMMs summed afterwards.
#include "autograd/functions.h"
#include "autograd/functions/recording.h"
#include "autograd/recompute_memo.h"

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
    // The weight's and bias's gradients in one pass over g where the device
    // fuses them (cuBLASLt's BGRADB), as LinearGeluLinearBackward does.
    if (needs_grad(*this, 1)) {
      ops::LinearWeightGrads grads = ops::linear_weight_backward(g, x_, needs_grad(*this, 2));
      result[1] = ops::to(grads.weight, weight_dtype_);
      if (needs_grad(*this, 2)) result[2] = ops::to(grads.bias, bias_dtype_);
    } else if (needs_grad(*this, 2)) {
      result[2] = ops::to(ops::sum(ops::reshape(g, {-1, g.sizes().back()}), {0}), bias_dtype_);
    }
    return result;
  }
  void release_saved_tensors() override { x_ = weight_ = Tensor(); }

 private:
  Tensor x_, weight_;
  DType x_dtype_, weight_dtype_, bias_dtype_;
};

// linear(gelu(linear(x, W1, b1)), W2, b2), gelu the tanh approximation, as
// one node. Why one: the GELU's backward fuses into proj's input-gradient
// GEMM (cuBLASLt's DGELU epilogue) and fc's bias gradient into fc's weight
// gradient GEMM (BGRADB), and those GEMMs belong to the layers on either side
// of the GELU; separate nodes would each see only their own gradient. Over
// the rows x: [R, in], pre and h: [R, hidden], g: [R, out]:
//   forward   pre = x W1^T + b1, h = gelu(pre)       one GEMM (GELU_AUX_BIAS)
//             y = h W2^T + b2                         one GEMM (BIAS)
//   backward  dW2 = g^T h, db2 = sum_rows(g)          one GEMM (BGRADB)
//             grad_pre = (g W2) * gelu'(pre)          one GEMM (DGELU)
//             dW1 = grad_pre^T x, db1 = sum_rows(grad_pre)   one GEMM (BGRADB)
//             dx = grad_pre W1                        one GEMM
// db1 comes from BGRADB on dW1's GEMM, not DGELU_BGRAD on grad_pre's: on an
// H100 (GPT-2 124M's MLP in bf16, 16384 rows; cuBLASLt 13.1, 2026-11-26)
// BGRADB added 0.045 ms to dW1's GEMM where DGELU_BGRAD added 0.32 ms to the
// DGELU one, and it sums grad_pre as stored, as the unfused path does. Where
// the device has no fused call each line is the unfused ops, in the same
// order as Linear, GELU, Linear (the cpu's bits are theirs).
class LinearGeluLinearBackward final : public Node {
 public:
  // Inputs in order: x, fc_weight, fc_bias, proj_weight, proj_bias.
  LinearGeluLinearBackward(const Tensor& x, const Tensor& fc_weight, const Tensor& proj_weight, const Tensor& pre,
                           const Tensor& h, bool fc_needs_grad)
      : x_(fc_weight.requires_grad() ? x : Tensor()), fc_weight_(x.requires_grad() ? fc_weight : Tensor()),
        proj_weight_(fc_needs_grad ? proj_weight : Tensor()), pre_(fc_needs_grad ? pre : Tensor()),
        h_(proj_weight.requires_grad() ? h : Tensor()) {}
  std::string name() const override { return "LinearGeluLinearBackward"; }

  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];  // [..., out]
    TensorList result(5);
    parameter_grads(g, h_, 3, result);
    if (needs_grad(*this, 0) || needs_grad(*this, 1) || needs_grad(*this, 2)) {
      const Tensor grad_pre = ops::matmul_gelu_backward(g, proj_weight_, pre_);  // [..., hidden]
      if (needs_grad(*this, 0)) result[0] = ops::matmul(grad_pre, fc_weight_);
      parameter_grads(grad_pre, x_, 1, result);
    }
    return result;
  }
  void release_saved_tensors() override { x_ = fc_weight_ = proj_weight_ = pre_ = h_ = Tensor(); }

 private:
  // The gradients of the linear layer whose weight is input `weight` (its
  // bias is the next input), given its output's gradient and its input.
  void parameter_grads(const Tensor& grad_y, const Tensor& input, size_t weight, TensorList& result) const {
    const bool with_bias = needs_grad(*this, weight + 1);
    if (needs_grad(*this, weight)) {
      ops::LinearWeightGrads grads = ops::linear_weight_backward(grad_y, input, with_bias);
      result[weight] = std::move(grads.weight);
      result[weight + 1] = std::move(grads.bias);
    } else if (with_bias) {
      result[weight + 1] = ops::sum(ops::reshape(grad_y, {-1, grad_y.sizes().back()}), {0});
    }
  }

  Tensor x_, fc_weight_, proj_weight_, pre_, h_;
};

Tensor memoized_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return autograd::memoized(autograd::MemoizedOp::linear, {&x, &weight, &bias},
                            [&] { return TensorList{ops::linear(x, weight, bias)}; })[0];
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  const GradInputsAllowed recorded_here;
  Tensor y =
      autograd::memoized(autograd::MemoizedOp::matmul, {&a, &b}, [&] { return TensorList{ops::matmul(a, b)}; })[0];
  if (autograd::any_requires_grad({&a, &b})) autograd::record(y, std::make_shared<MatmulBackward>(a, b), {&a, &b});
  return y;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const GradInputsAllowed recorded_here;
  Tensor y = memoized_linear(x, weight, bias);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(y, std::make_shared<LinearBackward>(x, weight, bias), {&x, &weight, &bias});
  }
  return y;
}

Tensor linear_gelu_linear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                          const Tensor& proj_bias) {
  TESSERA_CHECK(fc_weight.dim() == 2 && proj_weight.dim() == 2 && proj_weight.size(1) == fc_weight.size(0),
                "linear_gelu_linear: fc_weight [hidden, in] and proj_weight [out, hidden] must agree on hidden, got "
                "{} and {}",
                fc_weight.sizes(), proj_weight.sizes());
  const GradInputsAllowed recorded_here;
  // Under selective activation checkpointing only the second product is
  // kept (autograd/recompute_memo.h says why).
  const ops::LinearGeluOutput hidden = ops::linear_gelu(x, fc_weight, fc_bias);
  Tensor y = memoized_linear(hidden.y, proj_weight, proj_bias);
  if (autograd::any_requires_grad({&x, &fc_weight, &fc_bias, &proj_weight, &proj_bias})) {
    const bool fc_needs_grad = autograd::any_requires_grad({&x, &fc_weight, &fc_bias});
    autograd::record(y,
                     std::make_shared<LinearGeluLinearBackward>(x, fc_weight, proj_weight, hidden.pre, hidden.y,
                                                                fc_needs_grad),
                     {&x, &fc_weight, &fc_bias, &proj_weight, &proj_bias});
  }
  return y;
}

}  // namespace tessera
