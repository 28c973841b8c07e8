// Elementwise ops against std:: references: broadcasting (zero strides,
// transposed inputs), type promotion, 16-bit inputs, in-place updates, unary
// maths and their derivatives, comparisons, where/masked_fill, dropout, meta
// shape inference and error paths.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "tensor/cpu/ulp.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

using namespace tessera;
namespace ops = tessera::ops;

namespace {

// Host values 0.5 * sin(i + seed) * (1 + i % 7): varied signs and magnitudes.
std::vector<double> host_values(int64_t count, double seed = 0.0) {
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = 0.5 * std::sin(static_cast<double>(i) + seed) * (1 + i % 7);
  return values;
}

Tensor tensor_of(const Shape& shape, DType dtype = DType::f32, double seed = 0.0) {
  return ops::from_vector(host_values(shape_numel(shape), seed), shape, {.dtype = dtype});
}

// The row-major index into `from` that broadcasting maps flat index `index` of `to` onto.
int64_t broadcast_index(int64_t index, const Shape& to, const Shape& from) {
  int64_t source = 0, stride = 1;
  for (int64_t d = static_cast<int64_t>(to.size()) - 1, e = static_cast<int64_t>(from.size()) - 1; d >= 0; --d, --e) {
    const int64_t i = index % to[d];
    index /= to[d];
    if (e >= 0) {
      if (from[e] != 1) source += i * stride;
      stride *= from[e];
    }
  }
  return source;
}

// Checks op(a, b) against fn on host values, with broadcasting. With max_ulp
// 0 the result must be the exact value rounded to out's dtype, bit for bit:
// IEEE rounds +, -, *, / correctly, and an f32 result computed here in f64 and
// rounded to f32 is rounded correctly too (53 >= 2 * 24 + 2 bits). Otherwise
// it must be within max_ulp units in the last place of f32 (out is f32).
void check_binary(const Tensor& out, const Tensor& a, const Tensor& b, const std::function<double(double, double)>& fn,
                  double max_ulp = 0.0) {
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>(), ov = out.to_vector<double>();
  REQUIRE(static_cast<int64_t>(ov.size()) == out.numel());
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double expected = fn(av[broadcast_index(i, out.sizes(), a.sizes())], bv[broadcast_index(i, out.sizes(), b.sizes())]);
    if (std::isnan(expected)) {
      CHECK(std::isnan(ov[i]));
    } else if (max_ulp == 0.0) {
      CHECK(ov[i] == (out.dtype() == DType::f32 ? static_cast<float>(expected) : expected));
    } else {
      REQUIRE(out.dtype() == DType::f32);
      CHECK(cpu::ulp_error(static_cast<float>(ov[i]), expected) <= max_ulp);
    }
  }
}

double gelu_tanh_inner(double x) { return std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x); }
double gelu_tanh_reference(double x) { return 0.5 * x * (1.0 + std::tanh(gelu_tanh_inner(x))); }
// The same function as x * sigmoid(2u), free of the cancellation in 1 + tanh(u) for x < 0.
double gelu_tanh_accurate(double x) { return x / (1.0 + std::exp(-2.0 * gelu_tanh_inner(x))); }
double gelu_erf_reference(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double sigmoid_reference(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Central difference of f at x.
double derivative(const std::function<double(double)>& f, double x) {
  const double h = 1e-6;
  return (f(x + h) - f(x - h)) / (2 * h);
}

}  // namespace

TEST_CASE("binary ops match std:: in f32 and f64") {
  for (DType dtype : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dtype));
    const Tensor a = tensor_of({5, 37}, dtype, 0.0);
    const Tensor b = ops::add(ops::abs(tensor_of({5, 37}, dtype, 1.0)), 0.25);  // positive: pow and div are tame
    check_binary(ops::add(a, b), a, b, std::plus<double>());
    check_binary(ops::sub(a, b), a, b, std::minus<double>());
    check_binary(ops::mul(a, b), a, b, std::multiplies<double>());
    check_binary(ops::div(a, b), a, b, std::divides<double>());
    // pow is std::pow in the element type: the same call in f64, libm's powf
    // (within 1 ulp) in f32.
    check_binary(ops::pow(b, a), b, a, [](double x, double y) { return std::pow(x, y); }, dtype == DType::f32 ? 1.0 : 0.0);
    check_binary(ops::maximum(a, b), a, b, [](double x, double y) { return std::max(x, y); });
    check_binary(ops::minimum(a, b), a, b, [](double x, double y) { return std::min(x, y); });
    CHECK(ops::add(a, b).dtype() == dtype);
  }
}

TEST_CASE("broadcasting: bias rows, per-row scales, scalars, and both sides") {
  const Tensor x = tensor_of({4, 6, 8});
  const Tensor bias = tensor_of({8}, DType::f32, 2.0);
  check_binary(ops::add(x, bias), x, bias, std::plus<double>());  // [B, T, C] + [C]

  const Tensor rows = tensor_of({24, 8});
  const Tensor scale = tensor_of({24, 1}, DType::f32, 3.0);
  check_binary(ops::mul(rows, scale), rows, scale, std::multiplies<double>());  // [N, C] * [N, 1]
  check_binary(ops::sub(scale, rows), scale, rows, std::minus<double>());       // [N, 1] - [N, C]

  const Tensor scalar = ops::scalar_tensor(1.5);
  check_binary(ops::div(x, scalar), x, scalar, std::divides<double>());

  const Tensor column = tensor_of({3, 1});
  const Tensor row = tensor_of({1, 5}, DType::f32, 4.0);
  const Tensor outer = ops::mul(column, row);  // both sides broadcast
  CHECK(outer.sizes() == Shape{3, 5});
  check_binary(outer, column, row, std::multiplies<double>());

  CHECK(ops::add(tensor_of({0, 3}), tensor_of({3})).sizes() == Shape{0, 3});
}

TEST_CASE("strided inputs: expanded, transposed and sliced views give the values of their copies") {
  const Tensor base = tensor_of({6, 8});
  const Tensor other = tensor_of({8, 6}, DType::f32, 5.0);
  const Tensor transposed = ops::transpose(other, 0, 1);  // [6, 8], strides [1, 6]
  REQUIRE_FALSE(transposed.is_contiguous());
  const Tensor expanded = ops::expand(tensor_of({1, 8}, DType::f32, 7.0), {6, 8});  // zero strides
  const Tensor sliced = ops::slice(tensor_of({6, 16}, DType::f32, 9.0), 1, 0, 16, 2);  // stride 2
  for (const Tensor& view : {transposed, expanded, sliced}) {
    const Tensor copy = ops::contiguous(view);
    CHECK(ops::add(base, view).to_vector<float>() == ops::add(base, copy).to_vector<float>());
    CHECK(ops::mul(view, base).to_vector<float>() == ops::mul(copy, base).to_vector<float>());
    CHECK(ops::gelu(view).to_vector<float>() == ops::gelu(copy).to_vector<float>());
    CHECK(ops::exp(view).to_vector<float>() == ops::exp(copy).to_vector<float>());
    CHECK(ops::gt(view, base).to_vector<float>() == ops::gt(copy, base).to_vector<float>());
  }
  // A strided output: add_ into a transposed view.
  Tensor target = ops::zeros({8, 6});
  Tensor target_t = ops::transpose(target, 0, 1);
  ops::add_(target_t, base);
  CHECK(ops::transpose(target, 0, 1).to_vector<float>() == base.to_vector<float>());
}

TEST_CASE("type promotion: tensors and scalars") {
  const Tensor f = tensor_of({4});
  const Tensor d = tensor_of({4}, DType::f64);
  const Tensor i = ops::from_vector(std::vector<int64_t>{1, -2, 3, 7}, {4}, {.dtype = DType::i32});
  const Tensor l = ops::from_vector(std::vector<int64_t>{5, 6, -7, 8}, {4});
  const Tensor b = ops::from_vector(std::vector<int64_t>{1, 0, 1, 0}, {4}, {.dtype = DType::boolean});
  const Tensor h = tensor_of({4}, DType::bf16);

  CHECK(ops::add(i, f).dtype() == DType::f32);
  CHECK(ops::add(f, d).dtype() == DType::f64);
  CHECK(ops::add(i, l).dtype() == DType::i64);
  CHECK(ops::add(i, l).to_vector<int64_t>() == std::vector<int64_t>{6, 4, -4, 15});
  CHECK(ops::add(h, f).dtype() == DType::f32);
  CHECK(ops::add(h, h).dtype() == DType::bf16);
  CHECK(ops::add(h, tensor_of({4}, DType::f16)).dtype() == DType::f32);
  CHECK(ops::mul(b, i).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 3, 0});
  // bool arithmetic is logic.
  const Tensor b2 = ops::from_vector(std::vector<int64_t>{1, 1, 0, 0}, {4}, {.dtype = DType::boolean});
  CHECK(ops::add(b, b2).dtype() == DType::boolean);
  CHECK(ops::add(b, b2).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 0});
  CHECK(ops::mul(b, b2).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0});
  // Division is true division.
  const Tensor quotient = ops::div(i, ops::full({4}, 2.0, {.dtype = DType::i32}));
  CHECK(quotient.dtype() == DType::f32);
  CHECK(quotient.to_vector<float>() == std::vector<float>{0.5f, -1.0f, 1.5f, 3.5f});

  // Scalars: floats keep the tensor's dtype, integers stay integral for integral scalars.
  CHECK(ops::add(f, 2.0).dtype() == DType::f32);
  CHECK(ops::add(h, 2.0).dtype() == DType::bf16);
  CHECK(ops::add(i, 2.0).dtype() == DType::i32);
  CHECK(ops::add(i, 2.0).to_vector<int64_t>() == std::vector<int64_t>{3, 0, 5, 9});
  CHECK(ops::add(i, 0.5).dtype() == DType::f32);
  CHECK(ops::add(i, 0.5).to_vector<float>() == std::vector<float>{1.5f, -1.5f, 3.5f, 7.5f});
  CHECK(ops::add(b, 1.0).dtype() == DType::i64);
  CHECK(ops::pow(i, 2.0).to_vector<int64_t>() == std::vector<int64_t>{1, 4, 9, 49});
  CHECK(ops::pow(i, 3.0).to_vector<int64_t>() == std::vector<int64_t>{1, -8, 27, 343});
  CHECK(ops::pow(i, 0.5).dtype() == DType::f32);
  CHECK_THROWS_WITH_AS(ops::pow(i, -1.0), doctest::Contains("negative integer powers"), Error);
  CHECK_THROWS_WITH_AS(ops::add(i, 1e12), doctest::Contains("does not fit in i32"), Error);
  // A bf16 tensor meets the scalar in f32: 1 + 0.01 rounds once, to bf16's 1.0078125.
  const Tensor one = ops::ones({1}, {.dtype = DType::bf16});
  CHECK(ops::add(one, 0.01).item() == 1.0078125);
  CHECK(ops::add(one, 0.001).item() == 1.0);
}

TEST_CASE("integer arithmetic wraps instead of overflowing; float to int saturates") {
  const Tensor big = ops::full({2}, 2147483647.0, {.dtype = DType::i32});
  CHECK(ops::add(big, 1.0).to_vector<int64_t>() == std::vector<int64_t>{-2147483648LL, -2147483648LL});
  const Tensor minimum = ops::full({1}, -2147483648.0, {.dtype = DType::i32});
  CHECK(ops::neg(minimum).item() == -2147483648.0);
  CHECK(ops::abs(minimum).item() == -2147483648.0);
  const Tensor wild = ops::from_vector(std::vector<float>{1e10f, -1e10f, std::nanf(""), -3.7f}, {4});
  CHECK(ops::to(wild, DType::i32).to_vector<int64_t>() ==
        std::vector<int64_t>{2147483647LL, -2147483648LL, 0, -3});
}

TEST_CASE("16-bit inputs compute in f32 and round once") {
  const Tensor x = tensor_of({33}, DType::f32);
  for (DType dtype : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    const Tensor h = ops::to(x, dtype);
    const Tensor y = ops::add(h, h);
    CHECK(y.dtype() == dtype);
    CHECK(y.to_vector<float>() == ops::to(ops::add(ops::to(h, DType::f32), ops::to(h, DType::f32)), dtype).to_vector<float>());
    const Tensor g = ops::gelu(h);
    CHECK(g.dtype() == dtype);
    CHECK(g.to_vector<float>() == ops::to(ops::gelu(ops::to(h, DType::f32)), dtype).to_vector<float>());
    CHECK(ops::gt(h, 0.0).dtype() == DType::boolean);
  }
}

TEST_CASE("unary maths match std:: in f32 and f64") {
  const Tensor base = tensor_of({3, 41}, DType::f64);
  const Tensor positive = ops::add(ops::abs(base), 0.1);
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> reference;
    bool needs_positive;
  };
  const std::vector<Case> cases = {
      {"neg", [](const Tensor& t) { return ops::neg(t); }, [](double v) { return -v; }, false},
      {"exp", [](const Tensor& t) { return ops::exp(t); }, [](double v) { return std::exp(v); }, false},
      {"log", [](const Tensor& t) { return ops::log(t); }, [](double v) { return std::log(v); }, true},
      {"sqrt", [](const Tensor& t) { return ops::sqrt(t); }, [](double v) { return std::sqrt(v); }, true},
      {"rsqrt", [](const Tensor& t) { return ops::rsqrt(t); }, [](double v) { return 1 / std::sqrt(v); }, true},
      {"abs", [](const Tensor& t) { return ops::abs(t); }, [](double v) { return std::abs(v); }, false},
      {"tanh", [](const Tensor& t) { return ops::tanh(t); }, [](double v) { return std::tanh(v); }, false},
      {"sigmoid", [](const Tensor& t) { return ops::sigmoid(t); }, sigmoid_reference, false},
      {"relu", [](const Tensor& t) { return ops::relu(t); }, [](double v) { return v > 0 ? v : 0.0; }, false},
      {"silu", [](const Tensor& t) { return ops::silu(t); }, [](double v) { return v * sigmoid_reference(v); }, false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const Tensor input = c.needs_positive ? positive : base;
    const auto values = input.to_vector<double>();
    for (DType dtype : {DType::f32, DType::f64}) {
      CAPTURE(dtype_name(dtype));
      const Tensor out = c.op(ops::to(input, dtype));
      CHECK(out.dtype() == dtype);
      const auto result = out.to_vector<double>();
      const auto rounded = ops::to(input, dtype).to_vector<double>();
      for (size_t i = 0; i < values.size(); ++i) {
        const double expected = c.reference(rounded[i]);
        if (dtype == DType::f32) {
          // vector_math.h's bounds (1.5 ulp), plus one rounding in silu's x * sigmoid(x).
          CHECK(cpu::ulp_error(static_cast<float>(result[i]), expected) <= 2.0);
        } else {
          // std:: in f64 (libm within 1 ulp) and at most 3 more roundings (silu).
          CHECK(std::abs(result[i] - expected) <= 4 * std::numeric_limits<double>::epsilon() * std::abs(expected));
        }
      }
    }
  }
}

TEST_CASE("unary maths on edge values: large arguments, zero, infinities, NaN") {
  const std::vector<float> edges = {-100.f, -20.f, -9.5f, -1e-5f, 0.f, 1e-5f, 9.5f, 20.f, 100.f};
  const Tensor x = ops::from_vector(edges, {static_cast<int64_t>(edges.size())});
  const auto s = ops::sigmoid(x).to_vector<double>();
  const auto t = ops::tanh(x).to_vector<double>();
  for (size_t i = 0; i < edges.size(); ++i) {
    CAPTURE(edges[i]);
    CHECK(s[i] == doctest::Approx(sigmoid_reference(edges[i])).epsilon(1e-5).scale(1e-30));
    CHECK(t[i] == doctest::Approx(std::tanh(edges[i])).epsilon(1e-6).scale(1e-30));
  }
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor specials = ops::from_vector(std::vector<float>{-inf, inf, std::nanf("")}, {3});
  const auto e = ops::exp(specials).to_vector<float>();
  CHECK(e[0] == 0.0f);
  CHECK(e[1] == inf);
  CHECK(std::isnan(e[2]));
  const auto r = ops::relu(specials).to_vector<float>();
  CHECK(r[0] == 0.0f);
  CHECK(r[1] == inf);
  CHECK(std::isnan(r[2]));
  CHECK(std::isnan(ops::log(ops::full({1}, -1.0)).item()));
  CHECK(ops::log(ops::zeros({1})).item() == -std::numeric_limits<double>::infinity());
}

TEST_CASE("gelu: the tanh and erf forms against their formulas, with derivatives") {
  std::vector<double> points;
  for (double v = -6.0; v <= 6.0; v += 0.125) points.push_back(v);
  const auto n = static_cast<int64_t>(points.size());
  const Tensor x64 = ops::from_vector(points, {n}, {.dtype = DType::f64});
  const Tensor x32 = ops::to(x64, DType::f32);
  const Tensor ones64 = ops::ones({n}, {.dtype = DType::f64});
  const Tensor ones32 = ops::ones({n});
  for (double v : points) CHECK(gelu_tanh_accurate(v) == doctest::Approx(gelu_tanh_reference(v)).epsilon(1e-14).scale(1));
  for (auto approximation : {GeluApproximation::tanh, GeluApproximation::none}) {
    const auto reference = approximation == GeluApproximation::tanh ? gelu_tanh_accurate : gelu_erf_reference;
    const auto y64 = ops::gelu(x64, approximation).to_vector<double>();
    const auto y32 = ops::gelu(x32, approximation).to_vector<double>();
    const auto d64 = ops::gelu_backward(ones64, x64, approximation).to_vector<double>();
    const auto d32 = ops::gelu_backward(ones32, x32, approximation).to_vector<double>();
    for (int64_t i = 0; i < n; ++i) {
      CAPTURE(points[i]);
      CHECK(y64[i] == doctest::Approx(reference(points[i])).epsilon(1e-14).scale(1e-14));
      // f32: relative accuracy, down to an absolute floor where 1 + erf cancels in the negative tail.
      CHECK(std::abs(y32[i] - reference(points[i])) <= 5e-7 + 2e-6 * std::abs(reference(points[i])));
      const double slope = derivative(reference, points[i]);
      CHECK(d64[i] == doctest::Approx(slope).epsilon(1e-8).scale(1));
      CHECK(d32[i] == doctest::Approx(slope).epsilon(1e-5).scale(1));
    }
  }
  // The two forms differ, but by little.
  const auto exact = ops::gelu(x64, GeluApproximation::none).to_vector<double>();
  const auto approximate = ops::gelu(x64, GeluApproximation::tanh).to_vector<double>();
  double largest = 0.0;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::abs(exact[i] - approximate[i]));
  CHECK(largest > 1e-5);
  CHECK(largest < 1e-3);
}

TEST_CASE("fused derivatives: grad_out * f'(saved) against finite differences") {
  const Tensor x = tensor_of({2, 25}, DType::f64, 0.3);
  const Tensor grad = tensor_of({2, 25}, DType::f64, 1.7);
  const auto xv = x.to_vector<double>(), gv = grad.to_vector<double>();
  const auto check = [&](const Tensor& result, const std::function<double(double)>& f) {
    const auto rv = result.to_vector<double>();
    for (size_t i = 0; i < xv.size(); ++i) {
      CHECK(rv[i] == doctest::Approx(gv[i] * derivative(f, xv[i])).epsilon(1e-7).scale(1e-7));
    }
  };
  check(ops::tanh_backward(grad, ops::tanh(x)), [](double v) { return std::tanh(v); });
  check(ops::sigmoid_backward(grad, ops::sigmoid(x)), sigmoid_reference);
  check(ops::silu_backward(grad, x), [](double v) { return v * sigmoid_reference(v); });
  check(ops::relu_backward(grad, x), [](double v) { return v > 0 ? v : 0.0; });

  CHECK(ops::relu_backward(ops::ones({3}), ops::from_vector(std::vector<float>{-1.f, 0.f, 2.f}, {3}))
            .to_vector<float>() == std::vector<float>{0.f, 0.f, 1.f});
  CHECK_THROWS_WITH_AS(ops::tanh_backward(ops::ones({3}), ops::ones({4})), doctest::Contains("tanh_backward"), Error);
  CHECK_THROWS_AS(ops::relu_backward(ops::ones({3}, {.dtype = DType::i32}), ops::ones({3})), Error);
}

TEST_CASE("unary ops on integers and bools") {
  const Tensor i = ops::from_vector(std::vector<int64_t>{-3, 0, 4}, {3}, {.dtype = DType::i32});
  CHECK(ops::neg(i).dtype() == DType::i32);
  CHECK(ops::neg(i).to_vector<int64_t>() == std::vector<int64_t>{3, 0, -4});
  CHECK(ops::abs(i).to_vector<int64_t>() == std::vector<int64_t>{3, 0, 4});
  CHECK(ops::relu(i).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 4});
  CHECK(ops::exp(i).dtype() == DType::f32);
  CHECK(ops::sqrt(ops::abs(i)).to_vector<float>()[2] == 2.0f);
  const Tensor b = ops::from_vector(std::vector<int64_t>{1, 0}, {2}, {.dtype = DType::boolean});
  CHECK_THROWS_WITH_AS(ops::exp(b), doctest::Contains("exp: not defined for bool"), Error);
  CHECK_THROWS_AS(ops::neg(b), Error);
  CHECK(ops::logical_not(b).to_vector<int64_t>() == std::vector<int64_t>{0, 1});
  CHECK(ops::logical_not(i).dtype() == DType::boolean);
  CHECK(ops::logical_not(i).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0});
}

TEST_CASE("comparisons: tensor and scalar forms, NaN, bool outputs") {
  const Tensor a = ops::from_vector(std::vector<float>{1.f, 2.f, 3.f, std::nanf("")}, {4});
  const Tensor b = ops::from_vector(std::vector<float>{3.f, 2.f, 1.f, 0.f}, {4});
  using V = std::vector<int64_t>;
  CHECK(ops::eq(a, b).dtype() == DType::boolean);
  CHECK(ops::eq(a, b).to_vector<int64_t>() == V{0, 1, 0, 0});
  CHECK(ops::ne(a, b).to_vector<int64_t>() == V{1, 0, 1, 1});
  CHECK(ops::lt(a, b).to_vector<int64_t>() == V{1, 0, 0, 0});
  CHECK(ops::le(a, b).to_vector<int64_t>() == V{1, 1, 0, 0});
  CHECK(ops::gt(a, b).to_vector<int64_t>() == V{0, 0, 1, 0});
  CHECK(ops::ge(a, b).to_vector<int64_t>() == V{0, 1, 1, 0});
  CHECK(ops::eq(a, 2.0).to_vector<int64_t>() == V{0, 1, 0, 0});
  CHECK(ops::ne(a, 2.0).to_vector<int64_t>() == V{1, 0, 1, 1});
  CHECK(ops::lt(a, 2.0).to_vector<int64_t>() == V{1, 0, 0, 0});
  CHECK(ops::le(a, 2.0).to_vector<int64_t>() == V{1, 1, 0, 0});
  CHECK(ops::gt(a, 2.0).to_vector<int64_t>() == V{0, 0, 1, 0});
  CHECK(ops::ge(a, 2.0).to_vector<int64_t>() == V{0, 1, 1, 0});
  // An integer tensor compares exactly against a fractional scalar.
  const Tensor i = ops::from_vector(std::vector<int64_t>{1, 2, 3}, {3});
  CHECK(ops::gt(i, 1.5).to_vector<int64_t>() == V{0, 1, 1});
  CHECK(ops::eq(i, ops::from_vector(std::vector<float>{1.f, 2.5f, 3.f}, {3})).to_vector<int64_t>() == V{1, 0, 1});
  // Broadcast comparison builds a causal mask.
  const Tensor rows = ops::arange(0, 3, 1, {.dtype = DType::i64});
  const Tensor mask = ops::le(ops::unsqueeze(rows, 0), ops::unsqueeze(rows, 1));
  CHECK(mask.sizes() == Shape{3, 3});
  CHECK(mask.to_vector<int64_t>() == V{1, 0, 0, 1, 1, 0, 1, 1, 1});
}

TEST_CASE("maximum and minimum propagate NaN") {
  const Tensor a = ops::from_vector(std::vector<float>{1.f, std::nanf(""), 3.f}, {3});
  const Tensor b = ops::from_vector(std::vector<float>{std::nanf(""), 2.f, 1.f}, {3});
  const auto hi = ops::maximum(a, b).to_vector<float>();
  const auto lo = ops::minimum(a, b).to_vector<float>();
  CHECK(std::isnan(hi[0]));
  CHECK(std::isnan(hi[1]));
  CHECK(hi[2] == 3.f);
  CHECK(std::isnan(lo[0]));
  CHECK(std::isnan(lo[1]));
  CHECK(lo[2] == 1.f);
}

TEST_CASE("where and masked_fill") {
  const Tensor condition = ops::from_vector(std::vector<int64_t>{1, 0, 1}, {3}, {.dtype = DType::boolean});
  const Tensor a = ops::from_vector(std::vector<float>{1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  const Tensor b = ops::scalar_tensor(-1.0, {.dtype = DType::f64});
  const Tensor picked = ops::where(condition, a, b);  // [3] x [2, 3] x []
  CHECK(picked.sizes() == Shape{2, 3});
  CHECK(picked.dtype() == DType::f64);
  CHECK(picked.to_vector<double>() == std::vector<double>{1, -1, 3, 4, -1, 6});
  const Tensor h = ops::to(a, DType::bf16);
  CHECK(ops::where(condition, h, h).dtype() == DType::bf16);
  CHECK(ops::where(condition, h, ops::zeros({1}, {.dtype = DType::bf16})).to_vector<float>() ==
        std::vector<float>{1, 0, 3, 4, 0, 6});
  CHECK_THROWS_WITH_AS(ops::where(ops::ones({3}), a, b), doctest::Contains("where: condition must be bool"), Error);
  CHECK_THROWS_AS(ops::where(ops::ones({4}, {.dtype = DType::boolean}), a, b), Error);

  const Tensor scores = ops::zeros({2, 3});
  const Tensor masked = ops::masked_fill(scores, condition, -std::numeric_limits<double>::infinity());
  const auto values = masked.to_vector<float>();
  for (size_t i : {0, 2, 3, 5}) CHECK(values[i] == -std::numeric_limits<float>::infinity());
  CHECK(values[1] == 0.f);
  CHECK(values[4] == 0.f);
  CHECK(ops::masked_fill(ops::to(scores, DType::bf16), condition, 7.0).to_vector<float>() ==
        std::vector<float>{7, 0, 7, 7, 0, 7});
  CHECK_THROWS_WITH_AS(ops::masked_fill(ops::zeros({3}), ops::ones({2, 3}, {.dtype = DType::boolean}), 0.0),
                       doctest::Contains("does not broadcast to x of shape [3]"), Error);
  CHECK_THROWS_WITH_AS(ops::masked_fill(scores, ops::ones({3}), 0.0), doctest::Contains("mask must be bool"), Error);
}

TEST_CASE("add_ and mul_ update in place") {
  Tensor out = tensor_of({4, 5});
  const auto before = out.to_vector<double>();
  const Tensor bias = tensor_of({5}, DType::f32, 1.0);
  const auto bv = bias.to_vector<double>();
  void* data = out.raw_data();
  ops::add_(out, bias, -0.5);
  CHECK(out.raw_data() == data);
  // One rounding of an exact product and sum: bitwise the f32 rounding of the f64 value.
  auto after = out.to_vector<double>();
  for (int64_t i = 0; i < 20; ++i) CHECK(after[i] == static_cast<float>(before[i] - 0.5 * bv[i % 5]));

  ops::mul_(out, 2.0);
  const auto doubled = out.to_vector<double>();
  for (int64_t i = 0; i < 20; ++i) CHECK(doubled[i] == 2 * after[i]);  // exact
  ops::mul_(out, ops::zeros({4, 1}));
  CHECK(ops::sum(ops::abs(out)).item() == 0.0);

  Tensor self = ops::full({3}, 2.0);
  ops::add_(self, self);  // aliasing the output is fine
  CHECK(self.to_vector<float>() == std::vector<float>{4, 4, 4});

  // A bf16 accumulator takes an f32 update, rounding once.
  Tensor low = ops::ones({2}, {.dtype = DType::bf16});
  ops::add_(low, ops::full({2}, 0.01));
  CHECK(low.to_vector<float>() == std::vector<float>{1.0078125f, 1.0078125f});
  Tensor ints = ops::ones({2}, {.dtype = DType::i64});
  ops::add_(ints, ops::ones({2}, {.dtype = DType::i32}), 3.0);
  CHECK(ints.to_vector<int64_t>() == std::vector<int64_t>{4, 4});

  CHECK_THROWS_WITH_AS(ops::add_(out, ops::ones({3, 4, 5})), doctest::Contains("would broadcast out of shape [4, 5]"),
                       Error);
  Tensor expanded = ops::expand(ops::zeros({1, 5}), {4, 5});
  CHECK_THROWS_WITH_AS(ops::add_(expanded, bias), doctest::Contains("share memory"), Error);
  CHECK_THROWS_WITH_AS(ops::add_(ints, ops::ones({2})), doctest::Contains("cannot be written into i64"), Error);
  CHECK_THROWS_AS(ops::mul_(ints, 0.5), Error);
  Tensor undefined;
  CHECK_THROWS_AS(ops::add_(undefined, bias), Error);
  Tensor on_meta = ops::empty({4, 5}, {.device = kMeta});
  CHECK_THROWS_WITH_AS(ops::add_(on_meta, bias), doctest::Contains("different devices"), Error);
  ops::add_(on_meta, ops::empty({5}, {.device = kMeta}));  // shape checks only
  CHECK_THROWS_AS(ops::add_(on_meta, ops::empty({6}, {.device = kMeta})), Error);
}

TEST_CASE("meta tensors infer shapes and dtypes only") {
  const Tensor a = ops::empty({8, 1, 4}, {.device = kMeta});
  const Tensor b = ops::empty({3, 1}, {.dtype = DType::f64, .device = kMeta});
  const Tensor sum = ops::add(a, b);
  CHECK(sum.is_meta());
  CHECK(sum.sizes() == Shape{8, 3, 4});
  CHECK(sum.dtype() == DType::f64);
  CHECK(ops::lt(a, b).dtype() == DType::boolean);
  CHECK(ops::gelu(a).sizes() == a.sizes());
  CHECK(ops::exp(ops::empty({2}, {.dtype = DType::i32, .device = kMeta})).dtype() == DType::f32);
  CHECK(ops::where(ops::empty({4}, {.dtype = DType::boolean, .device = kMeta}), a, b).sizes() == Shape{8, 3, 4});
  const auto [y, mask] = ops::dropout(a, 0.5, {1, 2});
  CHECK(y.is_meta());
  CHECK(mask.sizes() == a.sizes());
  CHECK_THROWS_WITH_AS(ops::add(a, ops::empty({5}, {.device = kMeta})), doctest::Contains("[8, 1, 4]"), Error);
  CHECK_THROWS_WITH_AS(ops::add(a, ops::ones({4})), doctest::Contains("different devices: meta and cpu"), Error);
}

TEST_CASE("elementwise error paths name the op and shapes") {
  CHECK_THROWS_WITH_AS(ops::add(ops::ones({2, 3}), ops::ones({4})), doctest::Contains("add"), Error);
  CHECK_THROWS_WITH_AS(ops::mul(ops::ones({2, 3}), ops::ones({4})), doctest::Contains("[2, 3]"), Error);
  Tensor undefined;
  CHECK_THROWS_WITH_AS(ops::add(undefined, ops::ones({1})), doctest::Contains("add: a is an undefined tensor"), Error);
  CHECK_THROWS_AS(ops::exp(undefined), Error);
  const Tensor b = ops::ones({2}, {.dtype = DType::boolean});
  CHECK_THROWS_WITH_AS(ops::sub(b, b), doctest::Contains("sub: not defined for bool"), Error);
  CHECK_THROWS_AS(ops::pow(b, b), Error);
}

TEST_CASE("dropout: reproducible masks, kept fraction, scale, layout independence") {
  const Tensor x = ops::randn({64, 256}, PhiloxKey{3, 0});
  const PhiloxKey key{11, 42};
  const double p = 0.25;
  const auto [y, mask] = ops::dropout(x, p, key);
  CHECK(y.dtype() == DType::f32);
  CHECK(mask.sizes() == x.sizes());
  const auto mv = mask.to_vector<float>(), yv = y.to_vector<float>(), xv = x.to_vector<float>();
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  int64_t kept = 0;
  for (size_t i = 0; i < mv.size(); ++i) {
    const bool keep = philox_uniform(key, i) >= p;
    CHECK(mv[i] == (keep ? scale : 0.0f));
    CHECK(yv[i] == xv[i] * mv[i]);
    kept += keep;
  }
  // 16384 draws: the kept fraction's standard deviation is sqrt(p (1 - p) / n)
  // = 0.0034, so 0.015 is 4.4 of them (and Philox makes it the same number on
  // every machine).
  const double fraction = static_cast<double>(kept) / static_cast<double>(mv.size());
  CHECK(std::abs(fraction - (1 - p)) <= 0.015);

  // Same key, same mask; another key, another mask.
  CHECK(ops::dropout(x, p, key).second.to_vector<float>() == mv);
  CHECK(ops::dropout(x, p, PhiloxKey{11, 43}).second.to_vector<float>() != mv);
  // The mask follows the logical index, whatever the memory layout.
  const Tensor transposed = ops::transpose(ops::contiguous(ops::transpose(x, 0, 1)), 0, 1);
  REQUIRE_FALSE(transposed.is_contiguous());
  CHECK(ops::dropout(transposed, p, key).second.to_vector<float>() == mv);
  CHECK(ops::dropout(transposed, p, key).first.to_vector<float>() == yv);
  // 16-bit inputs.
  const auto [yh, mh] = ops::dropout(ops::to(x, DType::bf16), p, key);
  CHECK(yh.dtype() == DType::bf16);
  CHECK(mh.dtype() == DType::bf16);
  // p = 0 keeps everything.
  const auto [y0, m0] = ops::dropout(x, 0.0, key);
  CHECK(y0.to_vector<float>() == xv);
  CHECK_FALSE(y0.shares_storage_with(x));
  CHECK(ops::sum(m0).item() == static_cast<double>(x.numel()));

  CHECK_THROWS_WITH_AS(ops::dropout(x, 1.0, key), doctest::Contains("dropout: p must be in [0, 1), got 1"), Error);
  CHECK_THROWS_AS(ops::dropout(x, -0.1, key), Error);
  CHECK_THROWS_AS(ops::dropout(x, std::nan(""), key), Error);
  CHECK_THROWS_WITH_AS(ops::dropout(ops::ones({2}, {.dtype = DType::i32}), 0.5, key),
                       doctest::Contains("needs a floating tensor"), Error);
}

TEST_CASE("elementwise kernels give the same bits on 1 and 2 threads") {
  const Tensor x = ops::randn({300, 1000}, PhiloxKey{5, 1});
  const Tensor b = ops::randn({1000}, PhiloxKey{5, 2});
  const int threads = num_threads();
  set_num_threads(1);
  const auto gelu_one = ops::gelu(x).to_vector<float>();
  const auto add_one = ops::add(x, b).to_vector<float>();
  set_num_threads(2);
  CHECK(ops::gelu(x).to_vector<float>() == gelu_one);
  CHECK(ops::add(x, b).to_vector<float>() == add_one);
  set_num_threads(threads);
}
