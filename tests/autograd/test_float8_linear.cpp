// float8_linear (autograd/functions.h) against its formula, written out here
// from float8_bits' codes: scales 448 / amax (e4m3) and 57344 / amax (e5m2),
// every product of two float8 values summed and unscaled; its gradients
// against the f64 linear layer's (within float8's error: float8 is lossy, so
// the check is the formula plus closeness, not finite differences of a
// step function); a weight unscaled and scaled again at its scale (FSDP's
// float8 all-gather) gives the same codes; the refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "tensor/float8_bits.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

Tensor float8_input(const Shape& shape, uint64_t stream, double std) {
  return ops::mul(ops::randn(shape, PhiloxKey{77, stream}), std);
}

// The values a tensor casts to at its own tensorwise scale, as the formula
// says: scale = max_finite / amax (in f32), code = format(value * scale).
struct Quantised {
  std::vector<double> values;  // the float8 values, unscaled by nothing
  float scale = 0.0f;
};

Quantised quantise(const Tensor& tensor, const float8_bits::Format& format, float max_finite) {
  const std::vector<float> values = tensor.to_vector<float>();
  float amax = 0.0f;
  for (const float value : values) amax = std::max(amax, std::fabs(value));
  Quantised q;
  q.scale = max_finite / std::max(amax, 1e-12f);
  for (const float value : values) {
    q.values.push_back(float8_bits::float_from_code(float8_bits::code_from_float(value * q.scale, format), format));
  }
  return q;
}

// a [rows, k] b^T ([cols, k]) in f64, times inverse.
std::vector<double> product(const std::vector<double>& a, const std::vector<double>& b, int64_t rows, int64_t cols,
                            int64_t k, double inverse) {
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      double sum = 0.0;
      for (int64_t i = 0; i < k; ++i) sum += a[r * k + i] * b[c * k + i];
      out.push_back(sum * inverse);
    }
  }
  return out;
}

std::vector<double> transposed(const std::vector<double>& m, int64_t rows, int64_t cols) {
  std::vector<double> t(m.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  }
  return t;
}

void check_formula(const std::vector<float>& actual, const std::vector<double>& expected) {
  REQUIRE(actual.size() == expected.size());
  double scale = 0.0;
  for (const double value : expected) scale = std::max(scale, std::fabs(value));
  for (size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(i);
    CHECK(std::fabs(actual[i] - expected[i]) <= 1e-6 * scale);  // f32 sums of exact products
  }
}

// |a - b| / |b| over all elements (Frobenius).
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double difference = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(difference / norm);
}

}  // namespace

TEST_CASE("float8_linear: the forward and both gradients are the float8 formula; the bias stays exact") {
  const int64_t rows = 6, in = 40, out = 12;
  const Tensor x_values = float8_input({2, 3, in}, 1, 3.0);
  const Tensor w_values = float8_input({out, in}, 2, 0.05);
  const Tensor g_values = float8_input({2, 3, out}, 3, 1e-3);
  Tensor x = x_values, w = w_values, b = float8_input({out}, 4, 0.5);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor y = float8_linear(x, w, b);
  CHECK(y.dtype() == DType::f32);
  CHECK(y.sizes() == Shape{2, 3, out});
  autograd::backward({y}, {g_values});

  const Quantised xq = quantise(x_values, float8_bits::e4m3(), 448.0f);
  const Quantised wq = quantise(w_values, float8_bits::e4m3(), 448.0f);
  const Quantised gq = quantise(g_values, float8_bits::e5m2(), 57344.0f);
  const auto inverse = [](float a, float b) { return static_cast<double>((1.0f / a) * (1.0f / b)); };
  std::vector<double> expected_y = product(xq.values, wq.values, rows, out, in, inverse(xq.scale, wq.scale));
  const std::vector<double> bias = b.to_vector<double>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) expected_y[r * out + o] += bias[o];
  }
  check_formula(y.to_vector<float>(), expected_y);
  // grad_x = g W, grad_w = g^T x, from the codes; grad_b = the rows' sum of g itself.
  check_formula(x.grad().to_vector<float>(),
                product(gq.values, transposed(wq.values, out, in), rows, in, out, inverse(gq.scale, wq.scale)));
  check_formula(w.grad().to_vector<float>(), product(transposed(gq.values, rows, out), transposed(xq.values, rows, in),
                                                     out, in, rows, inverse(gq.scale, xq.scale)));
  const std::vector<double> g = g_values.to_vector<double>();
  std::vector<double> expected_bias(out, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) expected_bias[o] += g[r * out + o];
  }
  check_formula(b.grad().to_vector<float>(), expected_bias);
}

TEST_CASE("float8_linear: output and gradients within float8's error of the f64 linear layer's") {
  const Tensor x_values = float8_input({8, 64}, 5, 1.0);
  const Tensor w_values = float8_input({32, 64}, 6, 0.1);
  const Tensor g_values = float8_input({8, 32}, 7, 1.0);
  const auto run = [&](bool in_float8) {
    Tensor x = ops::to(x_values, in_float8 ? DType::f32 : DType::f64);
    Tensor w = ops::to(w_values, in_float8 ? DType::f32 : DType::f64);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    const Tensor y = in_float8 ? float8_linear(x, w, Tensor()) : tessera::linear(x, w, Tensor());
    autograd::backward({y}, {ops::to(g_values, y.dtype())});
    return std::vector<std::vector<double>>{y.to_vector<double>(), x.grad().to_vector<double>(),
                                            w.grad().to_vector<double>()};
  };
  const auto exact = run(false), float8 = run(true);
  // e4m3 keeps 3 mantissa bits (relative rounding 2^-4 at most) and e5m2 2 (2^-3):
  // sums of many such products land within a few percent.
  CHECK(relative_error(float8[0], exact[0]) < 0.05);
  CHECK(relative_error(float8[1], exact[1]) < 0.1);
  CHECK(relative_error(float8[2], exact[2]) < 0.1);
  CHECK(relative_error(float8[0], exact[0]) > 1e-4);  // and it is really float8, not f32
}

TEST_CASE("float8 weights: unscaled and scaled again at their scale, the codes come back; a given scale is used") {
  // Magnitudes from e4m3's subnormals to its largest value, and zeros.
  std::vector<double> values;
  for (int i = -40; i <= 40; ++i) values.push_back(std::ldexp(1.0 + 0.37 * (i % 5), i / 3) * (i % 2 ? -1.0 : 1.0));
  values.push_back(0.0);
  const Tensor w = ops::from_vector(values, {static_cast<int64_t>(values.size()) / 2, 2});
  const Tensor scale = ops::float8_scale(w, DType::f8e4m3);
  const Tensor codes = ops::to_float8(w, scale, DType::f8e4m3);
  const Tensor unscaled = ops::div(ops::to(codes, DType::f32), scale);  // what the float8 all-gather hands over
  CHECK(ops::as_bytes(ops::contiguous(ops::to_float8(unscaled, scale, DType::f8e4m3))).to_vector<int64_t>() ==
        ops::as_bytes(ops::contiguous(codes)).to_vector<int64_t>());
  const Tensor x = float8_input({3, 2}, 8, 1.0);
  CHECK(float8_linear(x, w, Tensor(), scale).to_vector<float>() == float8_linear(x, w, Tensor()).to_vector<float>());
  CHECK(float8_linear(x, unscaled, Tensor(), scale).to_vector<float>() ==
        float8_linear(x, w, Tensor()).to_vector<float>());
  CHECK(ops::float8_amax(ops::zeros({0, 4})).item() == 0.0);
  CHECK(ops::float8_max_finite(DType::f8e4m3) == 448.0);
  CHECK(ops::float8_max_finite(DType::f8e5m2) == 57344.0);
}

TEST_CASE("float8_linear and the scaling ops refuse what they cannot take") {
  CHECK_THROWS_WITH_AS(float8_linear(ops::zeros({2, 3}), ops::zeros({4, 5}), Tensor()),
                       doctest::Contains("expected x [..., in] and weight [out, in], got [2, 3] and [4, 5]"), Error);
  CHECK_THROWS_WITH_AS(float8_linear(ops::zeros({2, 3}), ops::zeros({4, 3}), ops::zeros({3})),
                       doctest::Contains("the bias must be [4], got [3]"), Error);
  CHECK_THROWS_WITH_AS(ops::float8_scale(ops::zeros({2}), DType::bf16), doctest::Contains("f8e4m3 or f8e5m2"), Error);
  CHECK_THROWS_WITH_AS(ops::to_float8(ops::zeros({2}), ops::zeros({1}), DType::f8e4m3),
                       doctest::Contains("the scale must be a 0-d f32 tensor"), Error);
  CHECK_THROWS_WITH_AS(ops::float8_amax(ops::zeros({2}, {.dtype = DType::i32})),
                       doctest::Contains("measures a wider floating tensor"), Error);
}
