// Differentiable elementwise ops. Binary ops broadcast, so each input's
// gradient is summed back to its own shape (and cast to its dtype); unary
// ops save the one tensor their derivative needs (the input or the output).
#include "autograd/functions.h"
#include "autograd/functions/recording.h"

namespace tessera {

namespace {

using autograd::needs_grad;
using autograd::Node;
using autograd::reduce_to;
using autograd::TensorList;

Tensor zero_like_scalar(const Tensor& like) {
  return ops::scalar_tensor(0.0, {.dtype = like.dtype(), .device = like.device()});
}

// The shapes and dtypes of a binary op's operands, to reduce their gradients to.
struct Operands {
  Shape a_shape, b_shape;
  DType a_dtype, b_dtype;
  Operands(const Tensor& a, const Tensor& b)
      : a_shape(a.sizes()), b_shape(b.sizes()), a_dtype(a.dtype()), b_dtype(b.dtype()) {}
};

// add: (g, g); sub: (g, -g).
class AddBackward final : public Node {
 public:
  AddBackward(const Tensor& a, const Tensor& b, bool subtract) : operands_(a, b), subtract_(subtract) {}
  std::string name() const override { return subtract_ ? "SubBackward" : "AddBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList result(2);
    if (needs_grad(*this, 0)) result[0] = reduce_to(g, operands_.a_shape, operands_.a_dtype);
    if (needs_grad(*this, 1)) {
      Tensor gb = reduce_to(g, operands_.b_shape, operands_.b_dtype);
      result[1] = subtract_ ? ops::neg(gb) : gb;
    }
    return result;
  }

 private:
  Operands operands_;
  bool subtract_;
};

// d(a*b) = (g*b, g*a); only the operand the other one's gradient needs is saved.
class MulBackward final : public Node {
 public:
  MulBackward(const Tensor& a, const Tensor& b)
      : operands_(a, b), a_(b.requires_grad() ? a : Tensor()), b_(a.requires_grad() ? b : Tensor()) {}
  std::string name() const override { return "MulBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList result(2);
    if (needs_grad(*this, 0)) result[0] = reduce_to(ops::mul(g, b_), operands_.a_shape, operands_.a_dtype);
    if (needs_grad(*this, 1)) result[1] = reduce_to(ops::mul(g, a_), operands_.b_shape, operands_.b_dtype);
    return result;
  }
  void release_saved_tensors() override { a_ = b_ = Tensor(); }

 private:
  Operands operands_;
  Tensor a_, b_;
};

// d(a/b) = (g/b, -g*a/b^2).
class DivBackward final : public Node {
 public:
  DivBackward(const Tensor& a, const Tensor& b) : operands_(a, b), a_(b.requires_grad() ? a : Tensor()), b_(b) {}
  std::string name() const override { return "DivBackward"; }
  TensorList apply(TensorList&& grads) override {
    Tensor g_over_b = ops::div(grads[0], b_);
    TensorList result(2);
    if (needs_grad(*this, 1)) {
      result[1] = reduce_to(ops::neg(ops::div(ops::mul(g_over_b, a_), b_)), operands_.b_shape, operands_.b_dtype);
    }
    if (needs_grad(*this, 0)) result[0] = reduce_to(g_over_b, operands_.a_shape, operands_.a_dtype);
    return result;
  }
  void release_saved_tensors() override { a_ = b_ = Tensor(); }

 private:
  Operands operands_;
  Tensor a_, b_;
};

// y = a^b: da = g * b * a^(b-1); db = g * y * log(a) where a > 0 and 0
// elsewhere (the real power is not differentiable in b at a <= 0; torch gives
// NaN for a < 0, we give 0 so one bad element cannot poison a whole gradient).
class PowBackward final : public Node {
 public:
  PowBackward(const Tensor& a, const Tensor& b, const Tensor& y) : operands_(a, b), a_(a), b_(b), y_(y) {}
  std::string name() const override { return "PowBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    TensorList result(2);
    if (needs_grad(*this, 0)) {
      Tensor da = ops::mul(ops::mul(g, b_), ops::pow(a_, ops::sub(b_, 1.0)));
      result[0] = reduce_to(da, operands_.a_shape, operands_.a_dtype);
    }
    if (needs_grad(*this, 1)) {
      Tensor db = ops::where(ops::gt(a_, 0.0), ops::mul(ops::mul(g, y_), ops::log(a_)), zero_like_scalar(g));
      result[1] = reduce_to(db, operands_.b_shape, operands_.b_dtype);
    }
    return result;
  }
  void release_saved_tensors() override { a_ = b_ = y_ = Tensor(); }

 private:
  Operands operands_;
  Tensor a_, b_, y_;
};

// x op scalar: the gradient scaled by a constant (add/sub: 1, mul: s, div: 1/s).
class ScaleBackward final : public Node {
 public:
  ScaleBackward(const char* name, double factor, bool divide) : name_(name), factor_(factor), divide_(divide) {}
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grads) override {
    if (divide_) return {ops::div(grads[0], factor_)};
    if (factor_ == 1.0) return {std::move(grads[0])};
    return {ops::mul(grads[0], factor_)};
  }

 private:
  const char* name_;
  double factor_;
  bool divide_;
};

// x^e: g * e * x^(e-1); exponent 0 gives zeros (not 0 * x^-1, NaN at x = 0).
class PowScalarBackward final : public Node {
 public:
  PowScalarBackward(const Tensor& x, double exponent) : x_(x), exponent_(exponent) {}
  std::string name() const override { return "PowBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    if (exponent_ == 0.0) return {ops::zeros_like(g)};
    if (exponent_ == 1.0) return {g};
    if (exponent_ == 2.0) return {ops::mul(g, ops::mul(x_, 2.0))};
    return {ops::mul(g, ops::mul(ops::pow(x_, exponent_ - 1.0), exponent_))};
  }
  void release_saved_tensors() override { x_ = Tensor(); }

 private:
  Tensor x_;
  double exponent_;
};

// A unary op whose derivative needs one saved tensor (its input or output):
// grad_input = formula(grad_output, saved).
template <typename Formula>
class UnaryBackward final : public Node {
 public:
  UnaryBackward(const char* name, Tensor saved, Formula formula)
      : name_(name), saved_(std::move(saved)), formula_(std::move(formula)) {}
  std::string name() const override { return name_; }
  TensorList apply(TensorList&& grads) override { return {formula_(grads[0], saved_)}; }
  void release_saved_tensors() override { saved_ = Tensor(); }

 private:
  const char* name_;
  Tensor saved_;
  Formula formula_;
};

// Records y = op(x) with a backward formula(g, saved). Saving the output y
// saves a detached handle: y's node must not own y.
template <typename Formula>
Tensor unary(Tensor y, const Tensor& x, const char* name, bool save_output, Formula formula) {
  if (!autograd::any_requires_grad({&x})) return y;
  Tensor saved = save_output ? y.detach() : x;
  autograd::record(y, std::make_shared<UnaryBackward<Formula>>(name, std::move(saved), std::move(formula)), {&x});
  return y;
}

Tensor scaled(Tensor y, const Tensor& x, const char* name, double factor, bool divide) {
  if (autograd::any_requires_grad({&x})) autograd::record(y, std::make_shared<ScaleBackward>(name, factor, divide), {&x});
  return y;
}

class WhereBackward final : public Node {
 public:
  WhereBackward(const Tensor& condition, const Tensor& a, const Tensor& b) : operands_(a, b), condition_(condition) {}
  std::string name() const override { return "WhereBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor zero = zero_like_scalar(g);
    TensorList result(2);
    if (needs_grad(*this, 0)) result[0] = reduce_to(ops::where(condition_, g, zero), operands_.a_shape, operands_.a_dtype);
    if (needs_grad(*this, 1)) result[1] = reduce_to(ops::where(condition_, zero, g), operands_.b_shape, operands_.b_dtype);
    return result;
  }
  void release_saved_tensors() override { condition_ = Tensor(); }

 private:
  Operands operands_;
  Tensor condition_;
};

class MaskedFillBackward final : public Node {
 public:
  MaskedFillBackward(const Tensor& x, const Tensor& mask) : shape_(x.sizes()), dtype_(x.dtype()), mask_(mask) {}
  std::string name() const override { return "MaskedFillBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {reduce_to(ops::where(mask_, zero_like_scalar(grads[0]), grads[0]), shape_, dtype_)};
  }
  void release_saved_tensors() override { mask_ = Tensor(); }

 private:
  Shape shape_;
  DType dtype_;
  Tensor mask_;
};

template <typename NodeType, typename... Args>
Tensor binary(Tensor y, const Tensor& a, const Tensor& b, Args&&... args) {
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(y, std::make_shared<NodeType>(std::forward<Args>(args)...), {&a, &b});
  }
  return y;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  const GradInputsAllowed recorded_here;
  return binary<AddBackward>(ops::add(a, b), a, b, a, b, false);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  const GradInputsAllowed recorded_here;
  return binary<AddBackward>(ops::sub(a, b), a, b, a, b, true);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  const GradInputsAllowed recorded_here;
  return binary<MulBackward>(ops::mul(a, b), a, b, a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  const GradInputsAllowed recorded_here;
  return binary<DivBackward>(ops::div(a, b), a, b, a, b);
}

Tensor pow(const Tensor& a, const Tensor& b) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::pow(a, b);
  if (!autograd::any_requires_grad({&a, &b})) return y;
  const Tensor saved_y = y.detach();
  return binary<PowBackward>(std::move(y), a, b, a, b, saved_y);
}

Tensor add(const Tensor& a, double b) {
  const GradInputsAllowed recorded_here;
  return scaled(ops::add(a, b), a, "AddBackward", 1.0, false);
}
Tensor sub(const Tensor& a, double b) {
  const GradInputsAllowed recorded_here;
  return scaled(ops::sub(a, b), a, "SubBackward", 1.0, false);
}
Tensor mul(const Tensor& a, double b) {
  const GradInputsAllowed recorded_here;
  return scaled(ops::mul(a, b), a, "MulBackward", b, false);
}
Tensor div(const Tensor& a, double b) {
  const GradInputsAllowed recorded_here;
  return scaled(ops::div(a, b), a, "DivBackward", b, true);
}

Tensor pow(const Tensor& a, double exponent) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::pow(a, exponent);
  if (autograd::any_requires_grad({&a})) autograd::record(y, std::make_shared<PowScalarBackward>(a, exponent), {&a});
  return y;
}

Tensor neg(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return scaled(ops::neg(x), x, "NegBackward", -1.0, false);
}

Tensor exp(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return unary(ops::exp(x), x, "ExpBackward", true, [](const Tensor& g, const Tensor& y) { return ops::mul(g, y); });
}

Tensor log(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return unary(ops::log(x), x, "LogBackward", false, [](const Tensor& g, const Tensor& in) { return ops::div(g, in); });
}

// d sqrt(x) = 1 / (2 y)
Tensor sqrt(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return unary(ops::sqrt(x), x, "SqrtBackward", true,
               [](const Tensor& g, const Tensor& y) { return ops::div(g, ops::mul(y, 2.0)); });
}

// y = x^(-1/2): dy/dx = -y^3 / 2
Tensor rsqrt(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return unary(ops::rsqrt(x), x, "RsqrtBackward", true, [](const Tensor& g, const Tensor& y) {
    return ops::mul(g, ops::mul(ops::mul(ops::mul(y, y), y), -0.5));
  });
}

Tensor tanh(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return unary(ops::tanh(x), x, "TanhBackward", true,
               [](const Tensor& g, const Tensor& y) { return ops::tanh_backward(g, y); });
}

Tensor sigmoid(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return unary(ops::sigmoid(x), x, "SigmoidBackward", true,
               [](const Tensor& g, const Tensor& y) { return ops::sigmoid_backward(g, y); });
}

Tensor relu(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return unary(ops::relu(x), x, "ReluBackward", false,
               [](const Tensor& g, const Tensor& in) { return ops::relu_backward(g, in); });
}

Tensor gelu(const Tensor& x, GeluApproximation approximation) {
  const GradInputsAllowed recorded_here;
  return unary(ops::gelu(x, approximation), x, "GeluBackward", false,
               [approximation](const Tensor& g, const Tensor& in) { return ops::gelu_backward(g, in, approximation); });
}

Tensor silu(const Tensor& x) {
  const GradInputsAllowed recorded_here;
  return unary(ops::silu(x), x, "SiluBackward", false,
               [](const Tensor& g, const Tensor& in) { return ops::silu_backward(g, in); });
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  const GradInputsAllowed recorded_here;
  return binary<WhereBackward>(ops::where(condition, a, b), a, b, condition, a, b);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const GradInputsAllowed recorded_here;
  Tensor y = ops::masked_fill(x, mask, value);
  if (autograd::any_requires_grad({&x})) autograd::record(y, std::make_shared<MaskedFillBackward>(x, mask), {&x});
  return y;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace tessera
