// Every differentiable function of autograd/functions.h against central
// finite differences in f64: broadcasting shapes, strided inputs, batched
// matmul, attention, norms (add_layer_norm's two outputs too), losses, dropout. Plus the checker itself: it must
// fail on a wrong backward and refuse inputs it cannot check.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"

using namespace tessera;
using namespace tessera::autograd;

namespace {

uint64_t next_stream = 0;

// A f64 leaf with uniform values in [low, high).
Tensor input(const Shape& shape, double low = -1.0, double high = 1.0, bool requires_grad = true) {
  Tensor u = ops::rand(shape, PhiloxKey{42, next_stream++}, {.dtype = DType::f64});
  Tensor t = ops::add(ops::mul(u, high - low), low);
  t.set_requires_grad(requires_grad);
  return t;
}

// A strided leaf: the transpose of a fresh [cols, rows] tensor.
Tensor transposed_input(int64_t rows, int64_t cols) {
  Tensor t = ops::transpose(input({cols, rows}, -1.0, 1.0, false), 0, 1);
  t.set_requires_grad(true);
  return t;
}

Tensor indices(const std::vector<int64_t>& values, const Shape& shape) { return ops::from_vector(values, shape); }

void check(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs, GradcheckOptions options = {}) {
  GradcheckResult result = gradcheck(f, inputs, options);
  INFO(result.report);
  CHECK(result.ok);
}

}  // namespace

TEST_CASE("gradcheck: views") {
  check([](const TensorList& in) { return view(in[0], {4, 3}); }, {input({3, 4})});
  check([](const TensorList& in) { return reshape(in[0], {2, -1}); }, {transposed_input(3, 4)});
  check([](const TensorList& in) { return flatten(in[0], 1); }, {input({2, 3, 2})});
  check([](const TensorList& in) { return permute(in[0], {2, 0, 1}); }, {input({2, 3, 4})});
  check([](const TensorList& in) { return transpose(in[0], 0, -1); }, {input({2, 3, 4})});
  check([](const TensorList& in) { return narrow(in[0], 1, 1, 2); }, {input({3, 4})});
  check([](const TensorList& in) { return slice(in[0], 0, 1, 6, 2); }, {input({6, 2})});
  check([](const TensorList& in) { return select(in[0], 1, -1); }, {transposed_input(3, 4)});
  check([](const TensorList& in) { return squeeze(in[0]); }, {input({2, 1, 3, 1})});
  check([](const TensorList& in) { return squeeze(in[0], 1); }, {input({2, 1, 3})});
  check([](const TensorList& in) { return unsqueeze(in[0], -1); }, {input({2, 3})});
  check([](const TensorList& in) { return expand(in[0], {2, 3, 4}); }, {input({3, 1})});
  check([](const TensorList& in) { return contiguous(in[0]); }, {transposed_input(3, 2)});
  check([](const TensorList& in) { return clone(in[0]); }, {input({5})});
}

TEST_CASE("gradcheck: dtype casts round-trip the gradient's dtype") {
  // Through f32 the finite differences need a wide step (f32 rounding).
  check([](const TensorList& in) { return to(mul(to(in[0], DType::f32), 2.0), DType::f64); }, {input({4})},
        {.eps = 1e-2, .atol = 1e-4, .rtol = 1e-3});
}

TEST_CASE("gradcheck: joining and splitting") {
  Tensor constant = input({2, 2}, -1.0, 1.0, false);
  check([&](const TensorList& in) { return cat({in[0], constant, in[1]}, 1); }, {input({2, 3}), input({2, 1})});
  check([](const TensorList& in) { return stack({in[0], in[1]}, -1); }, {input({2, 3}), transposed_input(2, 3)});
  // Piece 1 is unused: its part of the gradient is zero.
  check(
      [](const TensorList& in) {
        std::vector<Tensor> pieces = split(in[0], 2, 0);
        return mul(pieces[0], pieces[2]);
      },
      {input({6, 3})});
  check(
      [](const TensorList& in) {
        std::vector<Tensor> pieces = chunk(in[0], 3, 1);  // widths 3, 3, 1
        return cat({pieces[2], mul(pieces[0], 2.0)}, 1);
      },
      {input({2, 7})});
  // Row 1 is picked twice: its gradient sums.
  check([](const TensorList& in) { return index_select(in[0], 0, indices({1, 0, 1}, {3})); }, {input({3, 2})});
  check([](const TensorList& in) { return index_select(in[0], 1, indices({2, 2}, {2})); }, {transposed_input(2, 3)});
}

TEST_CASE("gradcheck: broadcasting binary ops") {
  check([](const TensorList& in) { return add(in[0], in[1]); }, {input({3, 1, 4}), input({2, 4})});
  check([](const TensorList& in) { return sub(in[0], in[1]); }, {input({2, 4}), input({3, 1, 4})});
  check([](const TensorList& in) { return mul(in[0], in[1]); }, {input({3, 1}), transposed_input(3, 4)});
  check([](const TensorList& in) { return div(in[0], in[1]); }, {input({2, 3}), input({3}, 0.5, 2.0)});
  check([](const TensorList& in) { return in[0] + in[1] * in[0] - in[1] / in[0]; },
        {input({2, 2}, 0.5, 1.5), input({2}, 0.5, 1.5)});
  check([](const TensorList& in) { return -in[0]; }, {input({3})});
  // One operand constant: only the other gets a gradient.
  Tensor constant = input({4}, 0.5, 2.0, false);
  check([&](const TensorList& in) { return div(constant, in[0]); }, {input({2, 4}, 0.5, 2.0)});
}

TEST_CASE("gradcheck: pow") {
  check([](const TensorList& in) { return pow(in[0], in[1]); }, {input({2, 3}, 0.5, 2.0), input({3}, -1.5, 2.5)});
  // Negative bases with integer exponents: the exponent is held constant
  // (d/db is undefined for a < 0).
  Tensor exponent = ops::from_vector(std::vector<double>{2, 3, 1}, {3}, {.dtype = DType::f64});
  check([&](const TensorList& in) { return pow(in[0], exponent); }, {input({2, 3}, -2.0, 2.0)});
  check([](const TensorList& in) { return pow(in[0], 3.0); }, {input({4}, -2.0, 2.0)});
  check([](const TensorList& in) { return pow(in[0], 2.0); }, {input({4}, -2.0, 2.0)});
  check([](const TensorList& in) { return pow(in[0], -0.5); }, {input({4}, 0.5, 2.0)});
  check([](const TensorList& in) { return pow(in[0], 0.0); }, {input({4}, 0.5, 2.0)});
}

TEST_CASE("pow gives the exponent no gradient where the base is not positive") {
  Tensor a = ops::from_vector(std::vector<double>{-2, 0, 2}, {3}, {.dtype = DType::f64});
  Tensor b = ops::from_vector(std::vector<double>{2, 2, 2}, {3}, {.dtype = DType::f64});
  b.set_requires_grad(true);
  backward(sum(pow(a, b)));
  const std::vector<double> grad = b.grad().to_vector<double>();
  CHECK(grad[0] == 0.0);
  CHECK(grad[1] == 0.0);
  CHECK(grad[2] == doctest::Approx(4.0 * std::log(2.0)));
}

TEST_CASE("gradcheck: scalar ops and unary maths") {
  check([](const TensorList& in) { return add(in[0], 2.0); }, {input({3})});
  check([](const TensorList& in) { return sub(in[0], 2.0); }, {input({3})});
  check([](const TensorList& in) { return mul(in[0], -3.0); }, {input({3})});
  check([](const TensorList& in) { return div(in[0], 4.0); }, {input({3})});
  check([](const TensorList& in) { return neg(in[0]); }, {transposed_input(2, 3)});
  check([](const TensorList& in) { return exp(in[0]); }, {input({2, 3})});
  check([](const TensorList& in) { return log(in[0]); }, {input({2, 3}, 0.5, 3.0)});
  check([](const TensorList& in) { return sqrt(in[0]); }, {input({2, 3}, 0.5, 3.0)});
  check([](const TensorList& in) { return rsqrt(in[0]); }, {input({2, 3}, 0.5, 3.0)});
  check([](const TensorList& in) { return tanh(in[0]); }, {input({2, 3}, -2.0, 2.0)});
  check([](const TensorList& in) { return sigmoid(in[0]); }, {input({2, 3}, -3.0, 3.0)});
  check([](const TensorList& in) { return relu(in[0]); }, {input({3, 4})});
  check([](const TensorList& in) { return gelu(in[0]); }, {input({3, 4}, -3.0, 3.0)});
  check([](const TensorList& in) { return tessera::gelu(in[0], GeluApproximation::none); }, {input({3, 4}, -3.0, 3.0)});
  check([](const TensorList& in) { return silu(in[0]); }, {transposed_input(3, 4)});
}

TEST_CASE("gradcheck: where and masked_fill") {
  Tensor condition = ops::gt(input({2, 3}, -1.0, 1.0, false), 0.0);
  check([&](const TensorList& in) { return where(condition, in[0], in[1]); }, {input({2, 3}), input({3})});
  Tensor row_mask = ops::from_vector(std::vector<int64_t>{1, 0, 1}, {3});
  Tensor mask = ops::ne(row_mask, 0.0);
  check([&](const TensorList& in) { return masked_fill(in[0], mask, -7.0); }, {input({2, 3})});
}

TEST_CASE("gradcheck: reductions") {
  check([](const TensorList& in) { return sum(in[0]); }, {input({2, 3})});
  check([](const TensorList& in) { return sum(in[0], {0, 2}); }, {input({2, 3, 2})});
  check([](const TensorList& in) { return sum(in[0], {-1}, true); }, {transposed_input(3, 4)});
  check([](const TensorList& in) { return mean(in[0]); }, {input({2, 3})});
  check([](const TensorList& in) { return mean(in[0], {1}, true); }, {input({2, 3, 2})});
  check([](const TensorList& in) { return amax(in[0], {1}); }, {input({3, 5})});
  check([](const TensorList& in) { return amax(in[0]); }, {input({3, 5})});
  check([](const TensorList& in) { return max(in[0], 0).first; }, {input({4, 3})});
  check([](const TensorList& in) { return max(in[0], -1, true).first; }, {transposed_input(2, 5)});
}

TEST_CASE("amax shares the gradient among ties, max gives it to the first") {
  Tensor x = ops::from_vector(std::vector<double>{1, 3, 3, 2}, {4}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  backward(amax(x));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5, 0});
  x.set_grad({});
  backward(max(x, 0).first);
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 0});
}

TEST_CASE("gradcheck: matmul in every shape") {
  auto mm = [](const TensorList& in) { return matmul(in[0], in[1]); };
  check(mm, {input({3, 4}), input({4, 2})});
  check(mm, {input({4}), input({4, 2})});
  check(mm, {input({3, 4}), input({4})});
  check(mm, {input({4}), input({4})});
  check(mm, {input({2, 3, 4}), input({4, 2})});             // [B, T, C] @ [C, N]
  check(mm, {input({3, 4}), input({2, 4, 2})});             // 2-d @ batched
  check(mm, {input({2, 1, 3, 2}), input({3, 2, 4})});       // broadcast batch dims
  check(mm, {input({2, 3}), input({2, 3, 2})});
  check(mm, {transposed_input(3, 4), transposed_input(4, 2)});
  check(mm, {input({3}), input({2, 3, 2})});
  check(mm, {input({2, 2, 3}), input({3})});
}

TEST_CASE("gradcheck: linear") {
  auto lin = [](const TensorList& in) { return linear(in[0], in[1], in[2]); };
  check(lin, {input({3, 4}), input({2, 4}), input({2})});
  check(lin, {input({2, 3, 4}), transposed_input(2, 4), input({2})});
  check(lin, {input({4}), input({3, 4}), input({3})});
  check([](const TensorList& in) { return linear(in[0], in[1], Tensor()); }, {input({2, 2, 3}), input({2, 3})});
  Tensor x = input({3, 4}, -1.0, 1.0, false);
  check([&](const TensorList& in) { return linear(x, in[0], in[1]); }, {input({2, 4}), input({2})});
}

TEST_CASE("gradcheck: linear_gelu_linear, with and without biases, and with some inputs held constant") {
  auto mlp = [](const TensorList& in) { return linear_gelu_linear(in[0], in[1], in[2], in[3], in[4]); };
  // Inputs in [-2, 2] reach GELU's curved part on both sides of 0.
  check(mlp, {input({2, 3, 4}, -2.0, 2.0), input({6, 4}), input({6}), input({5, 6}), input({5})});
  check(mlp, {input({4}, -2.0, 2.0), transposed_input(6, 4), input({6}), input({3, 6}), input({3})});
  check([](const TensorList& in) { return linear_gelu_linear(in[0], in[1], Tensor(), in[2], Tensor()); },
        {input({3, 4}, -2.0, 2.0), input({8, 4}), input({2, 8})});
  // Only proj's parameters, only fc's bias, only x: each branch of the backward alone.
  const Tensor x = input({3, 4}, -2.0, 2.0, false), w1 = input({6, 4}, -1.0, 1.0, false);
  const Tensor b1 = input({6}, -1.0, 1.0, false), w2 = input({5, 6}, -1.0, 1.0, false);
  check([&](const TensorList& in) { return linear_gelu_linear(x, w1, b1, in[0], in[1]); }, {input({5, 6}), input({5})});
  check([&](const TensorList& in) { return linear_gelu_linear(x, w1, in[0], w2, Tensor()); }, {input({6})});
  check([&](const TensorList& in) { return linear_gelu_linear(in[0], w1, b1, w2, Tensor()); },
        {input({2, 4}, -2.0, 2.0)});
}

TEST_CASE("gradcheck: softmax and log_softmax") {
  check([](const TensorList& in) { return softmax(in[0], -1); }, {input({3, 4}, -2.0, 2.0)});
  check([](const TensorList& in) { return softmax(in[0], 0); }, {input({3, 4}, -2.0, 2.0)});
  check([](const TensorList& in) { return log_softmax(in[0], -1); }, {transposed_input(3, 4)});
  check([](const TensorList& in) { return log_softmax(in[0], 1); }, {input({2, 3, 2}, -2.0, 2.0)});
}

TEST_CASE("gradcheck: layer_norm and rms_norm") {
  auto ln = [](const TensorList& in) { return layer_norm(in[0], in[1], in[2]); };
  check(ln, {input({2, 3, 5}), input({5}, 0.5, 1.5), input({5})});
  check([](const TensorList& in) { return layer_norm(in[0], Tensor(), Tensor()); }, {input({4, 5})});
  check([](const TensorList& in) { return layer_norm(in[0], in[1], Tensor()); }, {input({3, 4}), input({4})});
  check([](const TensorList& in) { return rms_norm(in[0], in[1]); }, {input({2, 3, 5}), input({5}, 0.5, 1.5)});
  check([](const TensorList& in) { return rms_norm(in[0], Tensor()); }, {transposed_input(3, 4)});
}

TEST_CASE("gradcheck: add_layer_norm, through both outputs, either alone, and each input alone") {
  // Both outputs stacked: the projection weighs every element of each.
  auto both = [](const TensorList& in) {
    const AddLayerNormOutput out = add_layer_norm(in[0], in[1], in[2], in[3]);
    return stack({out.sum, out.normalized}, 0);
  };
  check(both, {input({2, 3, 5}), input({2, 3, 5}), input({5}, 0.5, 1.5), input({5})});
  check(both, {transposed_input(3, 4), input({3, 4}), input({4}, 0.5, 1.5), input({4})});
  check([](const TensorList& in) { return add_layer_norm(in[0], in[1], in[2], in[3]).normalized; },
        {input({3, 4}), input({3, 4}), input({4}, 0.5, 1.5), input({4})});
  check([](const TensorList& in) { return add_layer_norm(in[0], in[1], in[2], in[3]).sum; },
        {input({3, 4}), input({3, 4}), input({4}, 0.5, 1.5), input({4})});
  check([](const TensorList& in) {
    const AddLayerNormOutput out = add_layer_norm(in[0], in[1], Tensor(), Tensor());
    return stack({out.sum, out.normalized}, 0);
  }, {input({4, 5}), input({4, 5})});
  // One input at a time needing a gradient; x as both operands.
  const Tensor x = input({3, 4}, -1.0, 1.0, false), delta = input({3, 4}, -1.0, 1.0, false);
  const Tensor w = input({4}, 0.5, 1.5, false), b = input({4}, -1.0, 1.0, false);
  check([&](const TensorList& in) {
    const AddLayerNormOutput out = add_layer_norm(x, in[0], w, b);
    return stack({out.sum, out.normalized}, 0);
  }, {input({3, 4})});
  check([&](const TensorList& in) { return add_layer_norm(x, delta, in[0], b).normalized; }, {input({4}, 0.5, 1.5)});
  check([&](const TensorList& in) { return add_layer_norm(x, delta, w, in[0]).normalized; }, {input({4})});
  check([&](const TensorList& in) {
    const AddLayerNormOutput out = add_layer_norm(in[0], in[0], w, b);
    return stack({out.sum, out.normalized}, 0);
  }, {input({3, 4})});
}

TEST_CASE("add_layer_norm records one node of two outputs; x and delta get equal, separate gradients") {
  Tensor x = input({2, 3}), delta = input({2, 3}), w = input({3}, 0.5, 1.5), b = input({3});
  const AddLayerNormOutput out = add_layer_norm(x, delta, w, b);
  REQUIRE(out.sum.grad_fn() != nullptr);
  CHECK(out.sum.grad_fn() == out.normalized.grad_fn());
  CHECK(out.sum.grad_fn()->name() == "AddLayerNormBackward");
  CHECK(out.sum.grad_fn()->num_outputs() == 2);
  CHECK(out.sum.grad_fn()->next_edges().size() == 4);
  backward(TensorList{sum(out.sum), sum(mul(out.normalized, out.normalized))});
  REQUIRE(x.grad().defined());
  CHECK(x.grad().to_vector<double>() == delta.grad().to_vector<double>());
  CHECK(x.grad().storage() != delta.grad().storage());  // the engine copied the shared gradient
  CHECK(w.grad().defined());
  CHECK(b.grad().defined());
  // Without grad mode: no node.
  NoGradGuard no_grad;
  CHECK(add_layer_norm(x, delta, w, b).sum.grad_fn() == nullptr);
}

TEST_CASE("gradcheck: embedding and cross_entropy") {
  Tensor ids = indices({1, 3, 1, 0, 2, 1}, {2, 3});  // row 1 used three times
  check([&](const TensorList& in) { return embedding(in[0], ids); }, {input({4, 3})});
  // Row 2 is ignored: it contributes no loss and no gradient.
  Tensor targets = indices({2, 0, -100, 4}, {4});
  check([&](const TensorList& in) { return cross_entropy(in[0], targets); }, {input({4, 5}, -2.0, 2.0)});
  Tensor other = indices({1, 7, 1}, {3});
  check([&](const TensorList& in) { return cross_entropy(in[0], other, 7); }, {input({3, 3}, -2.0, 2.0)});

  // A padded vocabulary: columns 3 and 4 are padding, outside the softmax.
  Tensor below_three = indices({2, 0, -100, 1}, {4});
  check([&](const TensorList& in) { return cross_entropy(in[0], below_three, -100, 3); }, {input({4, 5}, -2.0, 2.0)});

  Tensor logits = input({4, 5}, -2.0, 2.0);
  backward(cross_entropy(logits, targets));
  const std::vector<double> ignored_row = select(logits.grad(), 0, 2).to_vector<double>();
  CHECK(ignored_row == std::vector<double>(5, 0.0));
  Tensor padded = input({4, 5}, -2.0, 2.0);
  backward(cross_entropy(padded, below_three, -100, 3));
  CHECK(ops::narrow(padded.grad(), 1, 3, 2).to_vector<double>() == std::vector<double>(8, 0.0));
}

TEST_CASE("gradcheck: causal attention") {
  auto attention = [](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); };
  check(attention, {input({1, 2, 4, 3}), input({1, 2, 4, 3}), input({1, 2, 4, 3})});
  check(attention, {input({2, 1, 3, 2}), input({2, 1, 3, 2}), input({2, 1, 3, 2})});
  // q, k, v as strided views of one [B, T, 3, H, D] projection, as models make them.
  Tensor qkv = input({1, 3, 3, 2, 2}, -1.0, 1.0, false);
  Tensor q = ops::permute(ops::select(qkv, 2, 0), {0, 2, 1, 3});
  q.set_requires_grad(true);
  check(attention, {q, input({1, 2, 3, 2}), input({1, 2, 3, 2})});
}

TEST_CASE("gradcheck: dropout with a fixed key") {
  const PhiloxKey key{7, 3};
  check([&](const TensorList& in) { return dropout(in[0], 0.3, true, key); }, {input({4, 5})});

  Tensor x = input({100});
  Tensor y = dropout(x, 0.5, true, key);
  backward(sum(y));
  const std::vector<double> out = y.to_vector<double>();
  const std::vector<double> grad = x.grad().to_vector<double>();
  int kept = 0;
  for (size_t i = 0; i < grad.size(); ++i) {
    CHECK((grad[i] == 0.0 || grad[i] == 2.0));
    CHECK((grad[i] == 0.0) == (out[i] == 0.0));
    kept += grad[i] != 0.0;
  }
  CHECK(kept > 25);
  CHECK(kept < 75);
  CHECK(dropout(x, 0.5, false, key).is_same(x));
  CHECK_THROWS_AS(dropout(x, 1.5, false, key), Error);
}

namespace {

// d(x^2)/dx is 2x; this backward claims 3x.
struct WrongSquare : Function {
  TensorList forward(FunctionContext& ctx, const TensorList& in) override {
    ctx.save_for_backward({in[0]});
    return {ops::mul(in[0], in[0])};
  }
  TensorList backward(FunctionContext& ctx, const TensorList& grad) override {
    return {ops::mul(grad[0], ops::mul(ctx.saved()[0], 3.0))};
  }
};

}  // namespace

TEST_CASE("gradcheck fails on a wrong backward and says where") {
  GradcheckResult result =
      gradcheck([](const TensorList& in) { return Function::apply<WrongSquare>({in[0]})[0]; }, {input({2, 3}, 0.5, 1.5)});
  CHECK(!result.ok);
  CHECK(result.max_abs_error > 0.1);
  CHECK(result.report.find("input 0 element") != std::string::npos);
  CHECK(result.report.find("analytic") != std::string::npos);
}

TEST_CASE("gradcheck refuses inputs it cannot check") {
  auto identity = [](const TensorList& in) { return mul(in[0], 1.0); };
  Tensor f32 = ops::ones({2});
  f32.set_requires_grad(true);
  CHECK_THROWS_WITH_AS(gradcheck(identity, {f32}), doctest::Contains("f64"), Error);
  CHECK_THROWS_WITH_AS(gradcheck(identity, {input({2}, -1.0, 1.0, false)}), doctest::Contains("nothing to check"),
                       Error);
}
