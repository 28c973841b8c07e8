// The neural-network ops against naive f64 references written here, and their
// backwards against central finite differences: softmax, layer/RMS norm,
// embedding, cross-entropy and causal attention; add_layer_norm against add
// then layer_norm, bit for bit; plus meta shapes and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

using namespace tessera;

namespace {

std::vector<double> random_values(int64_t count, uint32_t seed, double scale = 1.0) {
  std::mt19937 generator(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> values(static_cast<size_t>(count));
  for (double& value : values) value = normal(generator);
  return values;
}

Tensor random_tensor(const Shape& shape, uint32_t seed, DType dtype = DType::f64) {
  return ops::from_vector(random_values(shape_numel(shape), seed), shape, {.dtype = dtype});
}

double dot(const Tensor& t, const std::vector<double>& weights) {
  const std::vector<double> values = t.to_vector<double>();
  double sum = 0.0;
  for (size_t i = 0; i < values.size(); ++i) sum += values[i] * weights[i];
  return sum;
}

// Central differences of the scalar f at x (f64), one element at a time.
std::vector<double> numeric_gradient(const std::function<double(const Tensor&)>& f, const Tensor& x) {
  const double h = 1e-6;
  std::vector<double> values = x.to_vector<double>(), grad(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const double saved = values[i];
    values[i] = saved + h;
    const double plus = f(ops::from_vector(values, x.sizes(), {.dtype = DType::f64}));
    values[i] = saved - h;
    const double minus = f(ops::from_vector(values, x.sizes(), {.dtype = DType::f64}));
    values[i] = saved;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

void check_close(const Tensor& got, const std::vector<double>& expected, double tolerance = 1e-6) {
  const std::vector<double> values = got.to_vector<double>();
  REQUIRE(values.size() == expected.size());
  for (size_t i = 0; i < values.size(); ++i) CHECK(values[i] == doctest::Approx(expected[i]).epsilon(tolerance));
}

// Softmax of each row of a [rows, cols] row-major array.
std::vector<double> reference_softmax(const std::vector<double>& x, int64_t rows, int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double max = -INFINITY, sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) max = std::max(max, x[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[r * cols + c] - max);
    for (int64_t c = 0; c < cols; ++c) {
      y[r * cols + c] = log ? x[r * cols + c] - max - std::log(sum) : std::exp(x[r * cols + c] - max) / sum;
    }
  }
  return y;
}

// The values of a float tensor as doubles: exact, so equal vectors are equal bits
// (the tests' values hold no NaN and no -0).
std::vector<double> bits_of(const Tensor& t) { return ops::to(t, DType::f64).to_vector<double>(); }

}  // namespace

TEST_CASE("softmax and log_softmax: rows match the reference, on any dim") {
  const Tensor x = random_tensor({4, 6}, 1);
  check_close(ops::softmax(x, -1), reference_softmax(x.to_vector<double>(), 4, 6, false), 1e-12);
  check_close(ops::log_softmax(x, 1), reference_softmax(x.to_vector<double>(), 4, 6, true), 1e-12);
  // dim 0: the softmax of the transpose, transposed back.
  const Tensor along_0 = ops::softmax(x, 0);
  CHECK(along_0.sizes() == Shape{4, 6});
  const std::vector<double> expected_t =
      reference_softmax(ops::transpose(x, 0, 1).to_vector<double>(), 6, 4, false);
  check_close(ops::transpose(along_0, 0, 1), expected_t, 1e-12);
  // f32 and large logits: stable, no overflow.
  const Tensor big = ops::from_vector(std::vector<float>{1000, 1001, 1002, -1000}, {1, 4});
  const std::vector<float> probs = ops::softmax(big, -1).to_vector<float>();
  const std::vector<double> expected = reference_softmax({1000, 1001, 1002, -1000}, 1, 4, false);
  for (size_t i = 0; i < probs.size(); ++i) CHECK(probs[i] == doctest::Approx(expected[i]).epsilon(1e-6));
  const std::vector<float> log_probs = ops::log_softmax(big, -1).to_vector<float>();
  CHECK(std::isfinite(log_probs[3]));
  CHECK(log_probs[3] == doctest::Approx(-2002.4076).epsilon(1e-6));
  // bf16 in, bf16 out, f32 inside.
  const Tensor half = ops::softmax(ops::to(x, DType::bf16), -1);
  CHECK(half.dtype() == DType::bf16);
  check_close(half, reference_softmax(ops::to(ops::to(x, DType::bf16), DType::f64).to_vector<double>(), 4, 6, false),
              1e-2);
}

TEST_CASE("softmax_backward and log_softmax_backward match finite differences") {
  const Tensor x = random_tensor({2, 3, 4}, 2);
  const std::vector<double> g = random_values(24, 3);
  const Tensor grad_out = ops::from_vector(g, {2, 3, 4}, {.dtype = DType::f64});
  for (int64_t dim : {-1, 1}) {
    const Tensor y = ops::softmax(x, dim);
    check_close(ops::softmax_backward(grad_out, y, dim),
                numeric_gradient([&](const Tensor& t) { return dot(ops::softmax(t, dim), g); }, x));
    const Tensor log_y = ops::log_softmax(x, dim);
    check_close(ops::log_softmax_backward(grad_out, log_y, dim),
                numeric_gradient([&](const Tensor& t) { return dot(ops::log_softmax(t, dim), g); }, x));
  }
}

TEST_CASE("layer_norm and rms_norm: outputs and statistics match the reference") {
  const int64_t rows = 3, cols = 7;
  const Tensor x = random_tensor({rows, cols}, 4);
  const Tensor weight = random_tensor({cols}, 5), bias = random_tensor({cols}, 6);
  const std::vector<double> xv = x.to_vector<double>(), wv = weight.to_vector<double>(), bv = bias.to_vector<double>();
  const double eps = 1e-5;
  std::vector<double> layer(xv.size()), rms(xv.size()), means(rows), layer_rstd(rows), rms_rstd(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0, square = 0.0;
    for (int64_t c = 0; c < cols; ++c) mean += xv[r * cols + c] / cols;
    for (int64_t c = 0; c < cols; ++c) var += (xv[r * cols + c] - mean) * (xv[r * cols + c] - mean) / cols;
    for (int64_t c = 0; c < cols; ++c) square += xv[r * cols + c] * xv[r * cols + c] / cols;
    means[r] = mean;
    layer_rstd[r] = 1 / std::sqrt(var + eps);
    rms_rstd[r] = 1 / std::sqrt(square + eps);
    for (int64_t c = 0; c < cols; ++c) {
      layer[r * cols + c] = (xv[r * cols + c] - mean) * layer_rstd[r] * wv[c] + bv[c];
      rms[r * cols + c] = xv[r * cols + c] * rms_rstd[r] * wv[c];
    }
  }
  const ops::NormOutput ln = ops::layer_norm(x, weight, bias, eps);
  check_close(ln.y, layer, 1e-12);
  check_close(ln.mean, means, 1e-12);
  check_close(ln.rstd, layer_rstd, 1e-12);
  CHECK(ln.mean.sizes() == Shape{rows});
  const ops::NormOutput rn = ops::rms_norm(x, weight, eps);
  CHECK_FALSE(rn.mean.defined());
  check_close(rn.y, rms, 1e-12);
  check_close(rn.rstd, rms_rstd, 1e-12);
  // No affine parameters: the plain normalised values.
  const ops::NormOutput plain = ops::layer_norm(x, Tensor(), Tensor(), eps);
  const std::vector<double> yv = plain.y.to_vector<double>();
  for (int64_t i = 0; i < rows * cols; ++i) CHECK(yv[i] == doctest::Approx((xv[i] - means[i / cols]) * layer_rstd[i / cols]));
  // bf16: computed in f32, statistics kept in f32.
  const ops::NormOutput half = ops::layer_norm(ops::to(x, DType::bf16), ops::to(weight, DType::bf16),
                                               ops::to(bias, DType::bf16), eps);
  CHECK(half.y.dtype() == DType::bf16);
  CHECK(half.rstd.dtype() == DType::f32);
  // bf16 inputs (x, weight and bias rounded by 2^-9 relative) and output: a
  // few bf16 roundings of values below ~3, against 3e-2 (1 + |y|).
  check_close(half.y, layer, 3e-2);
}

TEST_CASE("layer_norm_backward and rms_norm_backward match finite differences") {
  const Shape shape{2, 3, 5};
  const Tensor x = random_tensor(shape, 7), weight = random_tensor({5}, 8), bias = random_tensor({5}, 9);
  const std::vector<double> g = random_values(30, 10);
  const Tensor grad_y = ops::from_vector(g, shape, {.dtype = DType::f64});
  const double eps = 1e-5;

  const ops::NormOutput ln = ops::layer_norm(x, weight, bias, eps);
  const ops::NormGrads lg = ops::layer_norm_backward(grad_y, x, weight, ln.mean, ln.rstd, true);
  check_close(lg.x, numeric_gradient([&](const Tensor& t) { return dot(ops::layer_norm(t, weight, bias, eps).y, g); }, x));
  check_close(lg.weight,
              numeric_gradient([&](const Tensor& t) { return dot(ops::layer_norm(x, t, bias, eps).y, g); }, weight));
  check_close(lg.bias,
              numeric_gradient([&](const Tensor& t) { return dot(ops::layer_norm(x, weight, t, eps).y, g); }, bias));

  const ops::NormOutput rn = ops::rms_norm(x, weight, eps);
  const ops::NormGrads rg = ops::rms_norm_backward(grad_y, x, weight, rn.rstd);
  CHECK_FALSE(rg.bias.defined());
  check_close(rg.x, numeric_gradient([&](const Tensor& t) { return dot(ops::rms_norm(t, weight, eps).y, g); }, x));
  check_close(rg.weight, numeric_gradient([&](const Tensor& t) { return dot(ops::rms_norm(x, t, eps).y, g); }, weight));

  // Without affine parameters only dx comes back.
  const ops::NormOutput plain = ops::layer_norm(x, Tensor(), Tensor(), eps);
  const ops::NormGrads pg = ops::layer_norm_backward(grad_y, x, Tensor(), plain.mean, plain.rstd, false);
  CHECK_FALSE(pg.weight.defined());
  CHECK_FALSE(pg.bias.defined());
  check_close(pg.x,
              numeric_gradient([&](const Tensor& t) { return dot(ops::layer_norm(t, Tensor(), Tensor(), eps).y, g); }, x));
}

TEST_CASE("norm backward: weight and bias grads are the same bits on any thread count") {
  const Tensor x = random_tensor({1000, 24}, 11, DType::f32), weight = random_tensor({24}, 12, DType::f32);
  const Tensor bias = random_tensor({24}, 13, DType::f32), grad_y = random_tensor({1000, 24}, 14, DType::f32);
  const ops::NormOutput ln = ops::layer_norm(x, weight, bias, 1e-5);
  const int threads = num_threads();
  set_num_threads(1);
  const ops::NormGrads one = ops::layer_norm_backward(grad_y, x, weight, ln.mean, ln.rstd, true);
  set_num_threads(2);
  const ops::NormGrads two = ops::layer_norm_backward(grad_y, x, weight, ln.mean, ln.rstd, true);
  set_num_threads(threads);
  CHECK(one.weight.to_vector<float>() == two.weight.to_vector<float>());
  CHECK(one.bias.to_vector<float>() == two.bias.to_vector<float>());
  CHECK(one.x.to_vector<float>() == two.x.to_vector<float>());
  // And equal to the f64 sums.
  const std::vector<double> gy = grad_y.to_vector<double>();
  std::vector<double> bias_sum(24, 0.0);
  for (size_t i = 0; i < gy.size(); ++i) bias_sum[i % 24] += gy[i];
  check_close(one.bias, bias_sum, 1e-4);
}

TEST_CASE("norms: shape checks and meta") {
  CHECK_THROWS_WITH_AS(ops::layer_norm(ops::zeros({2, 4}), ops::zeros({3}), Tensor(), 1e-5),
                       "layer_norm: weight has shape [3], expected [4]", Error);
  CHECK_THROWS_AS(ops::rms_norm(ops::zeros({2, 4}), ops::zeros({4}, {.dtype = DType::f64}), 1e-5), Error);
  CHECK_THROWS_AS(ops::layer_norm(ops::zeros({2, 4}, {.dtype = DType::i64}), Tensor(), Tensor(), 1e-5), Error);
  const ops::NormOutput ln = ops::layer_norm(ops::zeros({2, 4}), Tensor(), Tensor(), 1e-5);
  CHECK_THROWS_WITH_AS(ops::layer_norm_backward(ops::zeros({2, 5}), ops::zeros({2, 4}), Tensor(), ln.mean, ln.rstd, false),
                       "layer_norm_backward: grad_y has shape [2, 5], expected [2, 4]", Error);
  const Tensor x = ops::empty({4, 8, 16}, {.device = kMeta});
  const ops::NormOutput meta = ops::layer_norm(x, ops::empty({16}, {.device = kMeta}), Tensor(), 1e-5);
  CHECK(meta.y.is_meta());
  CHECK(meta.y.sizes() == Shape{4, 8, 16});
  CHECK(meta.mean.sizes() == Shape{4, 8});
  const ops::NormGrads grads =
      ops::layer_norm_backward(x, x, ops::empty({16}, {.device = kMeta}), meta.mean, meta.rstd, true);
  CHECK(grads.x.sizes() == Shape{4, 8, 16});
  CHECK(grads.bias.sizes() == Shape{16});
  CHECK(ops::softmax(x, 1).sizes() == Shape{4, 8, 16});
}

TEST_CASE("add_layer_norm: the bits of add then layer_norm, forward and backward, in f32, f64 and bf16") {
  const Shape shape{3, 5, 37};
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    // delta is a transposed view: the op reads any strides.
    const Tensor x = random_tensor(shape, 21, dtype);
    const Tensor delta = ops::transpose(random_tensor({3, 37, 5}, 22, dtype), 1, 2);
    const Tensor weight = random_tensor({37}, 23, dtype), bias = random_tensor({37}, 24, dtype);
    const Tensor grad_y = random_tensor(shape, 25, dtype), grad_sum = random_tensor(shape, 26, dtype);
    const double eps = 1e-5;

    const ops::AddNormOutput fused = ops::add_layer_norm(x, delta, weight, bias, eps);
    const Tensor sum = ops::add(x, delta);
    const ops::NormOutput unfused = ops::layer_norm(sum, weight, bias, eps);
    CHECK(fused.sum.dtype() == dtype);
    CHECK(fused.norm.y.dtype() == dtype);
    CHECK(fused.norm.mean.sizes() == Shape{3, 5});
    CHECK(bits_of(fused.sum) == bits_of(sum));
    CHECK(bits_of(fused.norm.y) == bits_of(unfused.y));
    CHECK(bits_of(fused.norm.mean) == bits_of(unfused.mean));
    CHECK(bits_of(fused.norm.rstd) == bits_of(unfused.rstd));

    const ops::NormGrads fused_grads = ops::add_layer_norm_backward(grad_sum, grad_y, fused.sum, weight, fused.norm.mean,
                                                                    fused.norm.rstd, true);
    const ops::NormGrads norm_grads = ops::layer_norm_backward(grad_y, sum, weight, unfused.mean, unfused.rstd, true);
    CHECK(fused_grads.x.dtype() == dtype);
    CHECK(bits_of(fused_grads.x) == bits_of(ops::add(grad_sum, norm_grads.x)));
    CHECK(bits_of(fused_grads.weight) == bits_of(norm_grads.weight));
    CHECK(bits_of(fused_grads.bias) == bits_of(norm_grads.bias));
    // No gradient past the norm: layer_norm_backward's own.
    const ops::NormGrads alone = ops::add_layer_norm_backward(Tensor(), grad_y, fused.sum, weight, fused.norm.mean,
                                                              fused.norm.rstd, true);
    CHECK(bits_of(alone.x) == bits_of(norm_grads.x));
  }
}

TEST_CASE("add_layer_norm: without weight and bias, and the sum's rounding is add's (bf16)") {
  const Tensor x = random_tensor({4, 9}, 27, DType::f32), delta = random_tensor({4, 9}, 28, DType::f32);
  const ops::AddNormOutput plain = ops::add_layer_norm(x, delta, Tensor(), Tensor(), 1e-5);
  CHECK(bits_of(plain.norm.y) == bits_of(ops::layer_norm(ops::add(x, delta), Tensor(), Tensor(), 1e-5).y));
  const ops::NormGrads grads = ops::add_layer_norm_backward(x, delta, plain.sum, Tensor(), plain.norm.mean,
                                                            plain.norm.rstd, false);
  CHECK_FALSE(grads.weight.defined());
  CHECK_FALSE(grads.bias.defined());
  // bf16 values whose f32 sum is not a bf16 value: 1 + 2^-8 ties to even, 1.
  // The norm reads the rounded sum {1, -1, 0, 0}, whose mean is 0: the zeros
  // stay 0 (the f32 sum's mean, 2^-10, would move them).
  const Tensor a = ops::from_vector(std::vector<double>{1.0, -1.0, 0.0, 0.0}, {1, 4}, {.dtype = DType::bf16});
  const Tensor b = ops::from_vector(std::vector<double>{0.00390625, 0.0, 0.0, 0.0}, {1, 4}, {.dtype = DType::bf16});
  const ops::AddNormOutput rounded = ops::add_layer_norm(a, b, Tensor(), Tensor(), 0.0);
  CHECK(bits_of(rounded.sum) == bits_of(a));
  CHECK(bits_of(rounded.norm.y) == bits_of(ops::layer_norm(a, Tensor(), Tensor(), 0.0).y));
  CHECK(bits_of(rounded.norm.mean) == std::vector<double>{0.0});
  CHECK(bits_of(ops::narrow(rounded.norm.y, 1, 2, 2)) == std::vector<double>{0.0, 0.0});
}

TEST_CASE("add_layer_norm: errors name the operand and both shapes, dtypes or devices; meta shapes") {
  const Tensor x = ops::zeros({2, 4}), w = ops::ones({4});
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(x, ops::zeros({2, 5}), w, Tensor(), 1e-5),
                       "add_layer_norm: delta has shape [2, 5], x has [2, 4] (no broadcasting)", Error);
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(x, ops::zeros({4}), w, Tensor(), 1e-5),
                       "add_layer_norm: delta has shape [4], x has [2, 4] (no broadcasting)", Error);
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(x, ops::zeros({2, 4}, {.dtype = DType::f64}), w, Tensor(), 1e-5),
                       "add_layer_norm: delta has dtype f64, x has f32", Error);
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(x, ops::empty({2, 4}, {.device = kMeta}), w, Tensor(), 1e-5),
                       "add_layer_norm: delta is on meta, x on cpu", Error);
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(x, Tensor(), w, Tensor(), 1e-5), "add_layer_norm: delta is undefined",
                       Error);
  const Tensor integers = ops::zeros({2, 4}, {.dtype = DType::i64});
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(integers, integers, Tensor(), Tensor(), 1e-5),
                       "add_layer_norm: x must be floating, got i64", Error);
  CHECK_THROWS_WITH_AS(ops::add_layer_norm(x, x, ops::ones({3}), Tensor(), 1e-5),
                       "add_layer_norm: weight has shape [3], expected [4]", Error);
  const ops::AddNormOutput out = ops::add_layer_norm(x, x, w, Tensor(), 1e-5);
  CHECK_THROWS_WITH_AS(
      ops::add_layer_norm_backward(ops::zeros({2, 5}), x, out.sum, w, out.norm.mean, out.norm.rstd, false),
      "add_layer_norm_backward: grad_sum has shape [2, 5], sum has [2, 4] (no broadcasting)", Error);
  CHECK_THROWS_WITH_AS(ops::add_layer_norm_backward(x, x, out.sum, w, Tensor(), out.norm.rstd, false),
                       "add_layer_norm_backward: needs the forward's mean and rstd", Error);

  const Tensor meta = ops::empty({4, 8, 16}, {.device = kMeta});
  const Tensor meta_weight = ops::empty({16}, {.device = kMeta});
  const ops::AddNormOutput shapes = ops::add_layer_norm(meta, meta, meta_weight, Tensor(), 1e-5);
  CHECK(shapes.sum.is_meta());
  CHECK(shapes.sum.sizes() == Shape{4, 8, 16});
  CHECK(shapes.norm.y.sizes() == Shape{4, 8, 16});
  CHECK(shapes.norm.rstd.sizes() == Shape{4, 8});
  const ops::NormGrads grads =
      ops::add_layer_norm_backward(meta, meta, shapes.sum, meta_weight, shapes.norm.mean, shapes.norm.rstd, false);
  CHECK(grads.x.sizes() == Shape{4, 8, 16});
  CHECK(grads.weight.sizes() == Shape{16});
}

TEST_CASE("embedding: gathers rows; backward accumulates repeated indices") {
  const Tensor weight = ops::from_vector(std::vector<double>{0, 1, 10, 11, 20, 21, 30, 31, 40, 41}, {5, 2});
  const Tensor indices = ops::from_vector(std::vector<int64_t>{0, 4, 2, 2}, {2, 2});
  const Tensor out = ops::embedding(weight, indices);
  CHECK(out.sizes() == Shape{2, 2, 2});
  CHECK(out.to_vector<double>() == std::vector<double>{0, 1, 40, 41, 20, 21, 20, 21});
  const Tensor i32 = ops::from_vector(std::vector<int64_t>{3}, {1}, {.dtype = DType::i32});
  CHECK(ops::embedding(weight, i32).to_vector<double>() == std::vector<double>{30, 31});

  const Tensor grad_out = ops::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  const Tensor grad = ops::embedding_backward(grad_out, indices, 5);
  CHECK(grad.sizes() == Shape{5, 2});
  CHECK(grad.to_vector<double>() == std::vector<double>{1, 2, 0, 0, 12, 14, 0, 0, 3, 4});

  CHECK_THROWS_WITH_AS(ops::embedding(weight, ops::from_vector(std::vector<int64_t>{1, 5}, {2})),
                       "embedding: index 5 out of range for 5 embeddings", Error);
  CHECK_THROWS_WITH_AS(ops::embedding(weight, ops::from_vector(std::vector<int64_t>{-1}, {1})),
                       "embedding: index -1 out of range for 5 embeddings", Error);
  CHECK_THROWS_AS(ops::embedding(weight, ops::zeros({2})), Error);  // float indices
  CHECK_THROWS_AS(ops::embedding_backward(grad_out, indices, 3), Error);
  const Tensor meta = ops::embedding(ops::empty({50, 8}, {.device = kMeta}),
                                     ops::empty({4, 6}, {.dtype = DType::i64, .device = kMeta}));
  CHECK(meta.sizes() == Shape{4, 6, 8});
  CHECK(meta.is_meta());
}

TEST_CASE("cross_entropy: mean over kept rows, backward (softmax - onehot) / count") {
  const int64_t rows = 5, classes = 7, ignore = -100;
  const Tensor logits = random_tensor({rows, classes}, 15);
  const std::vector<int64_t> target_values{3, ignore, 0, 6, ignore};
  const Tensor targets = ops::from_vector(target_values, {rows});
  const std::vector<double> lv = logits.to_vector<double>();
  const std::vector<double> log_probs = reference_softmax(lv, rows, classes, true);
  double expected = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    if (target_values[r] != ignore) expected -= log_probs[r * classes + target_values[r]] / 3.0;
  }
  const Tensor loss = ops::cross_entropy(logits, targets);
  CHECK(loss.dim() == 0);
  CHECK(loss.item() == doctest::Approx(expected).epsilon(1e-12));

  const Tensor grad_loss = ops::scalar_tensor(2.0, {.dtype = DType::f64});
  const Tensor grad = ops::cross_entropy_backward(grad_loss, logits, targets);
  const std::vector<double> numeric =
      numeric_gradient([&](const Tensor& t) { return 2.0 * ops::cross_entropy(t, targets).item(); }, logits);
  check_close(grad, numeric);
  const std::vector<double> gv = grad.to_vector<double>();
  for (int64_t c = 0; c < classes; ++c) CHECK(gv[1 * classes + c] == 0.0);  // an ignored row

  // f32 and i32 targets, with a custom ignore_index.
  const Tensor targets_i32 = ops::from_vector(std::vector<int64_t>{3, 1, 0, 6, 1}, {rows}, {.dtype = DType::i32});
  const Tensor loss_f32 = ops::cross_entropy(ops::to(logits, DType::f32), targets_i32, 1);
  CHECK(loss_f32.dtype() == DType::f32);
  // f32 logits (rounded from the f64 ones, 6e-8 relative) and an f32
  // log-sum-exp: a few 1e-7 from the f64 loss, against 1e-6 (1 + |loss|).
  CHECK(loss_f32.item() == doctest::Approx(expected).epsilon(1e-6));

  // Every row ignored: 0/0 gives NaN like torch; the gradient is zero.
  const Tensor none = ops::from_vector(std::vector<int64_t>{ignore, ignore}, {2});
  CHECK(std::isnan(ops::cross_entropy(ops::zeros({2, 3}), none).item()));
  for (float value : ops::cross_entropy_backward(ops::scalar_tensor(1.0), ops::zeros({2, 3}), none).to_vector<float>()) {
    CHECK(value == 0.0f);
  }
}

// The first `classes` columns are the classes, the rest padding: the loss
// and gradient of the classes are those of the logits without the padding
// (the same bits: the same sums), and the padding's gradient is zero.
TEST_CASE("cross_entropy: padding columns are outside the softmax and get no gradient") {
  const int64_t rows = 5, classes = 7, columns = 12;
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    // The padding holds large values: any that leaked into the softmax would move the loss.
    Tensor logits = ops::to(random_tensor({rows, columns}, 21), dtype);
    Tensor padding = ops::narrow(logits, 1, classes, columns - classes);
    ops::fill_(padding, 30.0);
    const Tensor unpadded = ops::contiguous(ops::narrow(logits, 1, 0, classes));
    const Tensor targets = ops::from_vector(std::vector<int64_t>{3, -100, 0, 6, 2}, {rows});
    const ops::CrossEntropyOutput padded = ops::cross_entropy_with_logsumexp(logits, targets, -100, classes);
    const ops::CrossEntropyOutput plain = ops::cross_entropy_with_logsumexp(unpadded, targets);
    CHECK(padded.loss.to_vector<double>() == plain.loss.to_vector<double>());
    CHECK(padded.logsumexp.to_vector<double>() == plain.logsumexp.to_vector<double>());
    const Tensor grad_loss = ops::scalar_tensor(1.5, {.dtype = dtype});
    const Tensor grad = ops::cross_entropy_backward(grad_loss, logits, targets, -100, padded.logsumexp, classes);
    REQUIRE(grad.sizes() == Shape{rows, columns});
    CHECK(ops::contiguous(ops::narrow(grad, 1, 0, classes)).to_vector<double>() ==
          ops::cross_entropy_backward(grad_loss, unpadded, targets, -100, plain.logsumexp).to_vector<double>());
    CHECK(ops::contiguous(ops::narrow(grad, 1, classes, columns - classes)).to_vector<double>() ==
          std::vector<double>(rows * (columns - classes), 0.0));
    // Without the forward's logsumexp, the same gradient.
    CHECK(ops::cross_entropy_backward(grad_loss, logits, targets, -100, classes).to_vector<double>() ==
          grad.to_vector<double>());
  }
  const Tensor logits = ops::zeros({2, 6});
  const Tensor targets = ops::from_vector(std::vector<int64_t>{0, 4}, {2});
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, targets, -100, 4),
                       "cross_entropy: target 4 out of range for 4 classes (ignore_index is -100)", Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, targets, -100, 7),
                       "cross_entropy: classes must be in [1, 6] for logits [2, 6] (or kAllColumns), got 7", Error);
  CHECK_THROWS_AS(ops::cross_entropy(logits, targets, -100, 0), Error);
  CHECK_THROWS_AS(ops::cross_entropy_backward(ops::scalar_tensor(1.0), logits, targets, -100, -2), Error);
}

TEST_CASE("cross_entropy: large vocabularies stay accurate") {
  const int64_t rows = 4, classes = 50257;
  const Tensor logits = ops::from_vector(random_values(rows * classes, 16, 3.0), {rows, classes}, {.dtype = DType::f32});
  const std::vector<int64_t> target_values{0, 50256, 1234, 777};
  const Tensor targets = ops::from_vector(target_values, {rows});
  const std::vector<double> log_probs = reference_softmax(logits.to_vector<double>(), rows, classes, true);
  double expected = 0.0;
  for (int64_t r = 0; r < rows; ++r) expected -= log_probs[r * classes + target_values[r]] / rows;
  // Each row's 50257 exponentials are summed in f64 (lane_sum.h), so the
  // log-sum-exp is as accurate as one f32 exp (~1e-7 relative) and the row
  // loss within an f32 rounding of ~12 (1e-6): 1e-5 (1 + |loss|) is 10x that.
  CHECK(ops::cross_entropy(logits, targets).item() == doctest::Approx(expected).epsilon(1e-5));
}

TEST_CASE("cross_entropy: bad inputs throw") {
  const Tensor logits = ops::zeros({3, 4});
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, ops::from_vector(std::vector<int64_t>{0, 4, 1}, {3})),
                       "cross_entropy: target 4 out of range for 4 classes (ignore_index is -100)", Error);
  CHECK_THROWS_WITH_AS(ops::cross_entropy(logits, ops::from_vector(std::vector<int64_t>{0, 1}, {2})),
                       "cross_entropy: targets must be [3] for logits [3, 4], got [2]", Error);
  CHECK_THROWS_AS(ops::cross_entropy(ops::zeros({3, 4, 1}), ops::from_vector(std::vector<int64_t>{0, 1, 2}, {3})), Error);
  CHECK_THROWS_AS(ops::cross_entropy(logits, ops::zeros({3})), Error);  // float targets
  CHECK_THROWS_AS(ops::cross_entropy_backward(ops::zeros({2}), logits, ops::from_vector(std::vector<int64_t>{0, 1, 2}, {3})),
                  Error);
  const Tensor meta = ops::cross_entropy(ops::empty({8, 10}, {.device = kMeta}),
                                         ops::empty({8}, {.dtype = DType::i64, .device = kMeta}));
  CHECK(meta.is_meta());
  CHECK(meta.dim() == 0);
}

namespace {

// out and logsumexp of causal softmax(q k^T / sqrt(D)) v, per (b, h), in f64.
void reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::vector<double>* out,
                         std::vector<double>* lse) {
  const int64_t heads = q.size(0) * q.size(1), seq = q.size(2), dim = q.size(3);
  const std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  out->assign(qv.size(), 0.0);
  lse->assign(static_cast<size_t>(heads * seq), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t base = h * seq * dim;
    for (int64_t i = 0; i < seq; ++i) {
      std::vector<double> scores(static_cast<size_t>(seq), -INFINITY);
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0.0;
        for (int64_t d = 0; d < dim; ++d) s += qv[base + i * dim + d] * kv[base + j * dim + d];
        scores[j] = s * scale;
      }
      const std::vector<double> p = reference_softmax(scores, 1, seq, false);
      double max = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) max = std::max(max, scores[j]);
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(scores[j] - max);
      (*lse)[h * seq + i] = max + std::log(sum);
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t d = 0; d < dim; ++d) (*out)[base + i * dim + d] += p[j] * vv[base + j * dim + d];
      }
    }
  }
}

}  // namespace

TEST_CASE("causal_attention: matches explicit softmax(q k^T / sqrt(D) + mask) v") {
  // T = 70 crosses the kernel's 64-row query block.
  for (DType dtype : {DType::f64, DType::f32}) {
    const Shape shape{2, 2, 70, 8};
    const Tensor q = random_tensor(shape, 17, dtype), k = random_tensor(shape, 18, dtype),
                 v = random_tensor(shape, 19, dtype);
    std::vector<double> out, lse;
    reference_attention(q, k, v, &out, &lse);
    const ops::AttentionOutput result = ops::causal_attention(q, k, v);
    CHECK(result.out.dtype() == dtype);
    CHECK(result.logsumexp.sizes() == Shape{2, 2, 70});
    // Rounding bounds: each output is a convex combination of |v| <= 1 over at
    // most 70 keys of 8-term scores, so f32 is within ~100 u = 6e-6 of exact,
    // f64 within 1e-14; the tolerances keep a factor 15 and 10^4 over that.
    const double tolerance = dtype == DType::f64 ? 1e-10 : 1e-4;
    check_close(result.out, out, tolerance);
    check_close(result.logsumexp, lse, tolerance);
  }
  // bf16 in and out, f32 inside; the log-sum-exp stays f32.
  const Shape shape{1, 2, 9, 4};
  const Tensor q = random_tensor(shape, 28, DType::bf16), k = random_tensor(shape, 29, DType::bf16),
               v = random_tensor(shape, 30, DType::bf16);
  std::vector<double> out, lse;
  reference_attention(q, k, v, &out, &lse);
  const ops::AttentionOutput half = ops::causal_attention(q, k, v);
  CHECK(half.out.dtype() == DType::bf16);
  CHECK(half.logsumexp.dtype() == DType::f32);
  check_close(half.out, out, 2e-2);  // f32 inside, then one rounding to bf16 (2^-9 relative)
  check_close(half.logsumexp, lse, 1e-5);
}

TEST_CASE("causal_attention_backward: matches finite differences") {
  const Shape shape{1, 2, 5, 3};
  const Tensor q = random_tensor(shape, 20), k = random_tensor(shape, 21), v = random_tensor(shape, 22);
  const std::vector<double> g = random_values(30, 23);
  const Tensor grad_out = ops::from_vector(g, shape, {.dtype = DType::f64});
  const ops::AttentionOutput forward = ops::causal_attention(q, k, v);
  const ops::AttentionGrads grads = ops::causal_attention_backward(grad_out, q, k, v, forward.out, forward.logsumexp);
  check_close(grads.q, numeric_gradient([&](const Tensor& t) { return dot(ops::causal_attention(t, k, v).out, g); }, q));
  check_close(grads.k, numeric_gradient([&](const Tensor& t) { return dot(ops::causal_attention(q, t, v).out, g); }, k));
  check_close(grads.v, numeric_gradient([&](const Tensor& t) { return dot(ops::causal_attention(q, k, t).out, g); }, v));
}

TEST_CASE("causal_attention_backward: long sequences match finite differences on sampled entries") {
  // T = 70: probabilities rebuilt across two query blocks.
  const Shape shape{1, 1, 70, 4};
  const Tensor q = random_tensor(shape, 24), k = random_tensor(shape, 25), v = random_tensor(shape, 26);
  const std::vector<double> g = random_values(280, 27);
  const Tensor grad_out = ops::from_vector(g, shape, {.dtype = DType::f64});
  const ops::AttentionOutput forward = ops::causal_attention(q, k, v);
  const ops::AttentionGrads grads = ops::causal_attention_backward(grad_out, q, k, v, forward.out, forward.logsumexp);
  const auto numeric_at = [&](const Tensor& x, size_t index, const std::function<double(const Tensor&)>& f) {
    std::vector<double> values = x.to_vector<double>();
    const double h = 1e-6, saved = values[index];
    values[index] = saved + h;
    const double plus = f(ops::from_vector(values, shape, {.dtype = DType::f64}));
    values[index] = saved - h;
    const double minus = f(ops::from_vector(values, shape, {.dtype = DType::f64}));
    return (plus - minus) / (2 * h);
  };
  const std::vector<double> dq = grads.q.to_vector<double>(), dk = grads.k.to_vector<double>(),
                            dv = grads.v.to_vector<double>();
  for (size_t index : {size_t{0}, size_t{101}, size_t{255}, size_t{259}, size_t{279}}) {
    CHECK(dq[index] == doctest::Approx(numeric_at(q, index, [&](const Tensor& t) {
                         return dot(ops::causal_attention(t, k, v).out, g);
                       })).epsilon(1e-6));
    CHECK(dk[index] == doctest::Approx(numeric_at(k, index, [&](const Tensor& t) {
                         return dot(ops::causal_attention(q, t, v).out, g);
                       })).epsilon(1e-6));
    CHECK(dv[index] == doctest::Approx(numeric_at(v, index, [&](const Tensor& t) {
                         return dot(ops::causal_attention(q, k, t).out, g);
                       })).epsilon(1e-6));
  }
}

TEST_CASE("causal_attention: errors and meta") {
  CHECK_THROWS_WITH_AS(ops::causal_attention(ops::zeros({2, 4, 8}), ops::zeros({2, 4, 8}), ops::zeros({2, 4, 8})),
                       "causal_attention: q, k, v must be [B, H, T, D], got q [2, 4, 8]", Error);
  CHECK_THROWS_WITH_AS(
      ops::causal_attention(ops::zeros({1, 2, 4, 8}), ops::zeros({1, 2, 5, 8}), ops::zeros({1, 2, 4, 8})),
      "causal_attention: q, k, v shapes differ: [1, 2, 4, 8], [1, 2, 5, 8], [1, 2, 4, 8]", Error);
  CHECK_THROWS_AS(ops::causal_attention(ops::zeros({1, 2, 4, 8}), ops::zeros({1, 2, 4, 8}, {.dtype = DType::f64}),
                                        ops::zeros({1, 2, 4, 8})),
                  Error);
  const Tensor x = ops::empty({2, 12, 64, 64}, {.device = kMeta});
  const ops::AttentionOutput meta = ops::causal_attention(x, x, x);
  CHECK(meta.out.is_meta());
  CHECK(meta.logsumexp.sizes() == Shape{2, 12, 64});
  const ops::AttentionGrads grads = ops::causal_attention_backward(x, x, x, x, meta.out, meta.logsumexp);
  CHECK(grads.k.sizes() == Shape{2, 12, 64, 64});
  // The kernels read rows of D in place: a view strided along D is refused
  // there (the ops copy such a view first, and give its bits).
  const Tensor q = ops::randn({1, 2, 4, 8}, PhiloxKey{5, 1});
  const Tensor v_strided = ops::transpose(ops::randn({1, 2, 8, 4}, PhiloxKey{5, 2}), 2, 3);
  const Tensor out = ops::empty({1, 2, 4, 8}), lse = ops::empty({1, 2, 4});
  CHECK_THROWS_WITH_AS(kernels(kCPU).causal_attention(out, lse, q, q, v_strided),
                       doctest::Contains("cpu::causal_attention: v must be [B, H, T, D] with contiguous rows"), Error);
  const ops::AttentionOutput from_view = ops::causal_attention(q, q, v_strided);
  const ops::AttentionOutput from_copy = ops::causal_attention(q, q, ops::contiguous(v_strided));
  CHECK(ops::contiguous(from_view.out).to_vector<float>() == ops::contiguous(from_copy.out).to_vector<float>());
}
