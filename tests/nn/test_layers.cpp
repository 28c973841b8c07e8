// nn layers against explicit formulas: Linear, Embedding, LayerNorm, RMSNorm,
// GELU, SiLU, Dropout, CausalSelfAttention, MLP, TransformerBlock; the fused
// paths (MLP's linear_gelu_linear, TransformerBlock's add_layer_norm)
// against the unfused layers, bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/normalization.h"
#include "nn/transformer_block.h"
#include "tensor/ops.h"

using namespace tessera;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// f32 layers against f64 formulas: |actual - expected| < tolerance * (1 + |expected|).
// A few f32 roundings (6e-8 each) per value sit far below the default 1e-5;
// the normalisations, attention and the MLP (a division by a standard
// deviation, a softmax, a 32-wide GELU layer between two matmuls) get 1e-4.
void check_close(const std::vector<double>& actual, const std::vector<double>& expected, double tolerance = 1e-5) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(i);
    CHECK(actual[i] == doctest::Approx(expected[i]).epsilon(tolerance).scale(1.0));
  }
}

Tensor random_tensor(const Shape& shape, uint64_t stream, double std = 1.0) {
  return ops::mul(ops::randn(shape, PhiloxKey{7, stream}), std);
}

// y[r, o] = sum_i x[r, i] w[o, i] + b[o] for x: [rows, in], w: [out, in].
std::vector<double> linear_reference(const std::vector<double>& x, const std::vector<double>& w,
                                     const std::vector<double>& b, int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) sum += x[r * in + i] * w[o * in + i];
      y[r * out + o] = sum;
    }
  }
  return y;
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

}  // namespace

TEST_CASE("Linear: y = x W^T + b, default init bounds, gradients") {
  manual_seed(1);
  nn::Linear linear(5, 3);
  CHECK(linear.weight().sizes() == Shape{3, 5});
  CHECK(linear.bias().sizes() == Shape{3});
  for (double w : values(linear.weight().tensor())) CHECK(std::abs(w) <= 1.0 / std::sqrt(5.0));
  for (double b : values(linear.bias().tensor())) CHECK(std::abs(b) <= 1.0 / std::sqrt(5.0));

  const Tensor x = random_tensor({2, 4, 5}, 1);
  const Tensor y = linear(x);
  CHECK(y.sizes() == Shape{2, 4, 3});
  check_close(values(y), linear_reference(values(x), values(linear.weight().tensor()), values(linear.bias().tensor()),
                                          8, 5, 3));

  // d sum(y) / dW[o, i] = sum_r x[r, i]; d sum(y) / db = rows.
  autograd::backward(tessera::sum(y));
  const std::vector<double> xs = values(x);
  std::vector<double> expected(15, 0.0);
  for (int64_t r = 0; r < 8; ++r) {
    for (int64_t o = 0; o < 3; ++o) {
      for (int64_t i = 0; i < 5; ++i) expected[o * 5 + i] += xs[r * 5 + i];
    }
  }
  check_close(values(linear.weight().grad()), expected);
  CHECK(values(linear.bias().grad()) == std::vector<double>{8, 8, 8});  // sums of ones: exact

  nn::Linear no_bias(5, 3, {.bias = false, .init_std = 0.5});
  CHECK_FALSE(no_bias.has_bias());
  CHECK(no_bias.named_parameters().size() == 1);
  CHECK_THROWS_AS(no_bias.bias(), Error);
  check_close(values(no_bias(x)), linear_reference(values(x), values(no_bias.weight().tensor()), {}, 8, 5, 3));
  CHECK_THROWS_WITH_AS(linear(ops::zeros({2, 4})), "Linear: expected input [..., 5], got [2, 4]", Error);
  CHECK_THROWS_AS(nn::Linear(0, 3), Error);
}

TEST_CASE("Embedding: rows of the table") {
  nn::Embedding embedding(6, 3);
  const Tensor idx = ops::from_vector(std::vector<int64_t>{5, 0, 5, 2}, {2, 2});
  const Tensor y = embedding(idx);
  CHECK(y.sizes() == Shape{2, 2, 3});
  const std::vector<double> table = values(embedding.weight().tensor());
  std::vector<double> expected;
  for (int64_t row : {5, 0, 5, 2}) {
    for (int64_t c = 0; c < 3; ++c) expected.push_back(table[row * 3 + c]);
  }
  CHECK(values(y) == expected);  // copies
  CHECK(embedding.num_embeddings() == 6);
  CHECK(embedding.embedding_dim() == 3);
}

TEST_CASE("LayerNorm and RMSNorm: normalise the last dim, then scale and shift") {
  const Tensor x = random_tensor({3, 8}, 2, 3.0);
  const std::vector<double> xs = values(x);

  nn::LayerNorm layer_norm(8, {.eps = 1e-5});
  CHECK(values(layer_norm.weight().tensor()) == std::vector<double>(8, 1.0));
  CHECK(values(layer_norm.bias().tensor()) == std::vector<double>(8, 0.0));
  {
    autograd::NoGradGuard no_grad;
    ops::copy_(layer_norm.weight().tensor(), random_tensor({8}, 3));
    ops::copy_(layer_norm.bias().tensor(), random_tensor({8}, 4));
  }
  const std::vector<double> w = values(layer_norm.weight().tensor()), b = values(layer_norm.bias().tensor());
  std::vector<double> expected;
  for (int64_t r = 0; r < 3; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < 8; ++c) mean += xs[r * 8 + c] / 8;
    for (int64_t c = 0; c < 8; ++c) var += (xs[r * 8 + c] - mean) * (xs[r * 8 + c] - mean) / 8;
    for (int64_t c = 0; c < 8; ++c) expected.push_back((xs[r * 8 + c] - mean) / std::sqrt(var + 1e-5) * w[c] + b[c]);
  }
  check_close(values(layer_norm(x)), expected, 1e-4);

  nn::RMSNorm rms_norm(8, {.eps = 1e-6});
  {
    autograd::NoGradGuard no_grad;
    ops::copy_(rms_norm.weight().tensor(), random_tensor({8}, 5));
  }
  const std::vector<double> g = values(rms_norm.weight().tensor());
  expected.clear();
  for (int64_t r = 0; r < 3; ++r) {
    double mean_square = 0;
    for (int64_t c = 0; c < 8; ++c) mean_square += xs[r * 8 + c] * xs[r * 8 + c] / 8;
    for (int64_t c = 0; c < 8; ++c) expected.push_back(xs[r * 8 + c] / std::sqrt(mean_square + 1e-6) * g[c]);
  }
  check_close(values(rms_norm(x)), expected, 1e-4);

  nn::LayerNorm no_bias(8, {.bias = false});
  CHECK(no_bias.named_parameters().size() == 1);
  CHECK_THROWS_WITH_AS(layer_norm(ops::zeros({3, 7})), "LayerNorm: expected input [..., 8], got [3, 7]", Error);
  CHECK_THROWS_AS(rms_norm(ops::zeros({3, 7})), Error);
}

TEST_CASE("GELU (erf and tanh) and SiLU match their formulas") {
  const Tensor x = ops::from_vector(std::vector<float>{-3.0f, -1.0f, -0.25f, 0.0f, 0.5f, 2.0f}, {6});
  std::vector<double> erf_form, tanh_form, silu_form;
  for (double v : values(x)) {
    erf_form.push_back(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
    tanh_form.push_back(gelu_tanh(v));
    silu_form.push_back(v / (1.0 + std::exp(-v)));
  }
  nn::GELU exact;
  nn::GELU approximate(GeluApproximation::tanh);
  nn::SiLU silu;
  check_close(values(exact(x)), erf_form);
  check_close(values(approximate(x)), tanh_form);
  check_close(values(silu(x)), silu_form);
  CHECK(exact.named_parameters().empty());
}

TEST_CASE("Dropout: inverted in training, identity in eval, repeatable under manual_seed") {
  nn::Dropout dropout(0.25);
  const Tensor x = ops::ones({4000});
  manual_seed(3);
  const std::vector<double> first = values(dropout(x));
  int64_t zeros = 0;
  for (double v : first) {
    CHECK((v == 0.0 || v == doctest::Approx(1.0 / 0.75)));  // 4/3 rounded to f32
    zeros += v == 0.0;
  }
  // Binomial(4000, 0.25): 1000 zeros, standard deviation 27; 200 is 7 of them.
  CHECK(zeros > 800);
  CHECK(zeros < 1200);
  CHECK(values(dropout(x)) != first);  // a fresh key per call
  manual_seed(3);
  CHECK(values(dropout(x)) == first);

  dropout.eval();
  CHECK(dropout(x).is_same(x));
  CHECK(nn::Dropout(0.0)(x).is_same(x));
  CHECK_THROWS_AS(nn::Dropout(1.0), Error);
  CHECK_THROWS_AS(nn::Dropout(-0.1), Error);
}

TEST_CASE("CausalSelfAttention matches an explicit per-head computation") {
  manual_seed(11);
  nn::CausalSelfAttention attention(4, 2, {.init_std = 0.02});
  CHECK(attention.qkv().weight().sizes() == Shape{12, 4});
  CHECK(attention.proj().weight().sizes() == Shape{4, 4});

  const int64_t B = 2, T = 3, C = 4, H = 2, D = 2;
  const Tensor x = random_tensor({B, T, C}, 6);
  const std::vector<double> qkv = linear_reference(values(x), values(attention.qkv().weight().tensor()),
                                                   values(attention.qkv().bias().tensor()), B * T, C, 3 * C);
  // merged[b, t, h * D + d] = sum_s<=t softmax_s(q . k / sqrt(D)) v
  std::vector<double> merged(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        auto at = [&](int64_t part, int64_t s, int64_t d) { return qkv[(b * T + s) * 3 * C + part * C + h * D + d]; };
        std::vector<double> scores;
        double max_score = -1e300;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += at(0, t, d) * at(1, s, d);
          scores.push_back(dot / std::sqrt(static_cast<double>(D)));
          max_score = std::max(max_score, scores.back());
        }
        double total = 0;
        for (double& score : scores) total += (score = std::exp(score - max_score));
        for (int64_t s = 0; s <= t; ++s) {
          for (int64_t d = 0; d < D; ++d) merged[(b * T + t) * C + h * D + d] += scores[s] / total * at(2, s, d);
        }
      }
    }
  }
  const std::vector<double> expected = linear_reference(merged, values(attention.proj().weight().tensor()),
                                                        values(attention.proj().bias().tensor()), B * T, C, C);
  const Tensor y = attention(x);
  CHECK(y.sizes() == Shape{B, T, C});
  check_close(values(y), expected, 1e-4);
  CHECK_THROWS_AS(attention(ops::zeros({B, T, 5})), Error);
}

TEST_CASE("MLP and TransformerBlock compose their parts as documented") {
  manual_seed(12);
  nn::MLP mlp(8, 32, 8, std::make_shared<nn::GELU>(GeluApproximation::tanh), {.init_std = 0.02});
  const Tensor x = random_tensor({2, 3, 8}, 8);
  const std::vector<double> hidden =
      linear_reference(values(x), values(mlp.fc().weight().tensor()), values(mlp.fc().bias().tensor()), 6, 8, 32);
  std::vector<double> activated;
  for (double v : hidden) activated.push_back(gelu_tanh(v));
  check_close(values(mlp(x)), linear_reference(activated, values(mlp.proj().weight().tensor()),
                                               values(mlp.proj().bias().tensor()), 6, 32, 8),
              1e-4);

  nn::TransformerBlock block(8, 2, {.init_std = 0.02});
  std::vector<std::string> names;
  for (const auto& [name, parameter] : block.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                          "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                                          "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"});
  const Tensor h = tessera::add(x, block.attn()(block.ln1()(x)));
  const Tensor expected = tessera::add(h, block.mlp()(block.ln2()(h)));
  CHECK(values(block(x)) == values(expected));  // the same ops
}

TEST_CASE("MLP with GELU(tanh) runs as one linear_gelu_linear: the unfused layers' values and gradients, bit for bit") {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    manual_seed(13);
    nn::MLP mlp(8, 32, 6, std::make_shared<nn::GELU>(GeluApproximation::tanh), {.init_std = 0.3, .dtype = dtype});
    Tensor x = ops::to(random_tensor({2, 3, 8}, 9), dtype);
    x.set_requires_grad(true);
    const Tensor y = mlp(x);
    REQUIRE(y.grad_fn() != nullptr);
    CHECK(y.grad_fn()->name() == "LinearGeluLinearBackward");
    const Tensor unfused = mlp.proj()(tessera::gelu(mlp.fc()(x), GeluApproximation::tanh));
    CHECK(values(y) == values(unfused));
    const Tensor g = ops::to(random_tensor({2, 3, 6}, 10), dtype);
    const autograd::TensorList inputs{x, mlp.fc().weight().tensor(), mlp.fc().bias().tensor(), mlp.proj().weight().tensor(),
                            mlp.proj().bias().tensor()};
    const autograd::TensorList fused_grads = autograd::grad({y}, inputs, {g});
    const autograd::TensorList unfused_grads = autograd::grad({unfused}, inputs, {g});
    for (size_t i = 0; i < inputs.size(); ++i) {
      CAPTURE(i);
      CHECK(fused_grads[i].dtype() == dtype);
      CHECK(values(fused_grads[i]) == values(unfused_grads[i]));
    }
  }
}

TEST_CASE("MLP keeps the separate layers where fusing would change what runs: other activations, hooks") {
  const Tensor x = random_tensor({4, 8}, 11);
  nn::MLP erf(8, 16, 4, std::make_shared<nn::GELU>(GeluApproximation::none));
  CHECK(erf(x).grad_fn()->name() == "LinearBackward");
  nn::MLP relu(8, 16, 4, std::make_shared<nn::ReLU>());
  CHECK(relu(x).grad_fn()->name() == "LinearBackward");

  nn::MLP hooked(8, 16, 4, std::make_shared<nn::GELU>(GeluApproximation::tanh));
  CHECK(hooked(x).grad_fn()->name() == "LinearGeluLinearBackward");
  int calls = 0;
  auto handle = hooked.activation().register_forward_hook([&](nn::Module&, const nn::TensorList&, const Tensor&) {
    ++calls;
    return std::optional<Tensor>();
  });
  CHECK(hooked(x).grad_fn()->name() == "LinearBackward");
  CHECK(calls == 1);
  handle.remove();
  auto pre = hooked.fc().register_forward_pre_hook([&](nn::Module&, const nn::TensorList&) {
    ++calls;
    return std::optional<nn::TensorList>();
  });
  CHECK(hooked(x).grad_fn()->name() == "LinearBackward");
  CHECK(calls == 2);
  pre.remove();
  CHECK(hooked(x).grad_fn()->name() == "LinearGeluLinearBackward");
  CHECK_THROWS_WITH_AS(hooked(ops::zeros({2, 5})), "MLP: expected input [..., 8], got [2, 5]", Error);
}

TEST_CASE("TransformerBlock runs x + attn(...) and ln2 as one add_layer_norm, the unfused bits; a hook on ln2 unfuses") {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    manual_seed(14);
    nn::TransformerBlock block(8, 2, {.init_std = 0.3, .dtype = dtype});
    Tensor x = ops::to(random_tensor({2, 3, 8}, 15), dtype);
    x.set_requires_grad(true);
    const Tensor g = ops::to(random_tensor({2, 3, 8}, 16), dtype);
    autograd::TensorList inputs{x};
    for (const auto& [name, parameter] : block.named_parameters()) inputs.push_back(parameter->tensor());

    const Tensor fused = block(x);
    // out = h + mlp(ln2(h)): its first operand is add_layer_norm's sum.
    CHECK(fused.grad_fn()->next_edges()[0].node->name() == "AddLayerNormBackward");
    const autograd::TensorList fused_grads = autograd::grad({fused}, inputs, {g});

    int calls = 0;
    auto hook = block.ln2().register_forward_hook([&](nn::Module&, const nn::TensorList&, const Tensor&) {
      ++calls;
      return std::optional<Tensor>();
    });
    const Tensor unfused = block(x);
    CHECK(calls == 1);
    CHECK(unfused.grad_fn()->next_edges()[0].node->name() == "AddBackward");
    const autograd::TensorList unfused_grads = autograd::grad({unfused}, inputs, {g});
    hook.remove();
    CHECK(block(x).grad_fn()->next_edges()[0].node->name() == "AddLayerNormBackward");

    CHECK(values(fused) == values(unfused));
    for (size_t i = 0; i < inputs.size(); ++i) {
      CAPTURE(i);
      CHECK(fused_grads[i].dtype() == dtype);
      CHECK(values(fused_grads[i]) == values(unfused_grads[i]));
    }
  }
}

TEST_CASE("linear_gelu_linear refuses weights that disagree on the hidden size, naming both") {
  CHECK_THROWS_WITH_AS(
      linear_gelu_linear(ops::zeros({2, 4}), ops::zeros({8, 4}), Tensor(), ops::zeros({3, 6}), Tensor()),
      "linear_gelu_linear: fc_weight [hidden, in] and proj_weight [out, hidden] must agree on hidden, got [8, 4] and "
      "[3, 6]",
      Error);
  CHECK_THROWS_WITH_AS(linear_gelu_linear(ops::zeros({2, 5}), ops::zeros({8, 4}), Tensor(), ops::zeros({3, 8}), Tensor()),
                       "linear_gelu: input [2, 5] has 5 features, weight [8, 4] expects 4", Error);
}
