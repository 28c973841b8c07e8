// float8 training's linear layer, torchao's tensorwise recipe: the input and
// the weight cast to f8e4m3 at scales from their amax, the output's gradient
// to f8e5m2 (more range, less precision), every product of two float8
// operands summed in f32 and unscaled; the bias and its gradient stay in
// high precision. Backward keeps the float8 input (1 byte an element).
#include "autograd/functions.h"
#include "autograd/functions/recording.h"
#include "autograd/recompute_memo.h"

namespace tessera {

namespace {

using autograd::needs_grad;
using autograd::Node;
using autograd::TensorList;

// 1 / scale in f32: what a product of operands cast at `scale` is multiplied by.
Tensor inverse_of(const Tensor& scale) {
  return ops::div(ops::full({}, 1.0, {.dtype = DType::f32, .device = scale.device()}), scale);
}

// x: [..., in] -> [N, in].
Tensor rows_of(const Tensor& x) { return ops::reshape(x, {-1, x.size(-1)}); }

class Float8LinearBackward final : public Node {
 public:
  Float8LinearBackward(Tensor x_q, Tensor x_scale, Tensor w_q, Tensor w_scale, Shape x_shape, DType x_dtype,
                       DType w_dtype, DType bias_dtype)
      : x_q_(std::move(x_q)), x_scale_(std::move(x_scale)), w_q_(std::move(w_q)), w_scale_(std::move(w_scale)),
        x_shape_(std::move(x_shape)), x_dtype_(x_dtype), w_dtype_(w_dtype), bias_dtype_(bias_dtype) {}
  std::string name() const override { return "Float8LinearBackward"; }

  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor g_scale = ops::float8_scale(g, DType::f8e5m2);
    const Tensor g_q = ops::to_float8(g, g_scale, DType::f8e5m2);
    TensorList result(3);
    if (needs_grad(*this, 0)) {  // g W: [..., out] x [out, in]
      result[0] = ops::reshape(ops::float8_linear_product(g_q, ops::transpose(w_q_, 0, 1), inverse_of(g_scale),
                                                          inverse_of(w_scale_), x_dtype_),
                               x_shape_);
    }
    if (needs_grad(*this, 1)) {  // g^T x over every row: [out, N] x [N, in]
      result[1] = ops::float8_linear_product(ops::transpose(rows_of(g_q), 0, 1), ops::transpose(rows_of(x_q_), 0, 1),
                                             inverse_of(g_scale), inverse_of(x_scale_), w_dtype_);
    }
    if (needs_grad(*this, 2)) result[2] = ops::to(ops::sum(rows_of(ops::to(g, DType::f32)), {0}), bias_dtype_);
    return result;
  }
  void release_saved_tensors() override { x_q_ = x_scale_ = w_q_ = w_scale_ = Tensor(); }

 private:
  Tensor x_q_, x_scale_, w_q_, w_scale_;
  Shape x_shape_;
  DType x_dtype_, w_dtype_, bias_dtype_;
};

}  // namespace

Tensor float8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& weight_scale) {
  TESSERA_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
                "float8_linear: expected x [..., in] and weight [out, in], got {} and {}", x.sizes(), weight.sizes());
  TESSERA_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
                "float8_linear: the bias must be [{}], got {}", weight.size(0), bias.sizes());
  const GradInputsAllowed recorded_here;
  const Tensor x_scale = ops::float8_scale(x, DType::f8e4m3);
  const Tensor x_q = ops::to_float8(x, x_scale, DType::f8e4m3);
  const Tensor w_scale = weight_scale.defined() ? weight_scale : ops::float8_scale(weight, DType::f8e4m3);
  const Tensor w_q = ops::to_float8(weight, w_scale, DType::f8e4m3);
  // Selective checkpointing keeps the product; the casts are recomputed.
  Tensor y = autograd::memoized(autograd::MemoizedOp::linear, {&x, &weight, &bias}, [&] {
    const Tensor product = ops::float8_linear_product(x_q, w_q, inverse_of(x_scale), inverse_of(w_scale), x.dtype());
    return TensorList{bias.defined() ? ops::to(ops::add(product, bias), x.dtype()) : product};
  })[0];
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(y,
                     std::make_shared<Float8LinearBackward>(x_q, x_scale, w_q, w_scale, x.sizes(), x.dtype(),
                                                            weight.dtype(), bias.defined() ? bias.dtype() : x.dtype()),
                     {&x, &weight, &bias});
  }
  return y;
}

}  // namespace tessera
