// nn::Linear's fine-tuning adaptations: a LoRA adapter (y + alpha/r x A^T
// B^T, B zero at first, finite-difference gradients through it) and an NF4
// weight (frozen, packed, its product the dequantised weight's, its fresh
// init the dense layer's init quantised); the MLP leaves its fused GELU
// path for adapted layers; and the refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

using namespace tessera;

namespace {

std::vector<double> lora_values(const Tensor& t) { return t.to_vector<double>(); }

Tensor lora_input(const Shape& shape, uint64_t stream, DType dtype = DType::f32) {
  return ops::randn(shape, PhiloxKey{31, stream}, {.dtype = dtype});
}

// y = x W^T + b + scale (x A^T) B^T, in f64 from the values.
std::vector<double> adapted_reference(const Tensor& x, const nn::Linear& linear, const Tensor& weight) {
  const std::vector<double> xs = lora_values(x), w = lora_values(weight), a = lora_values(linear.lora_a().tensor()),
                            b = lora_values(linear.lora_b().tensor());
  const std::vector<double> bias = linear.has_bias() ? lora_values(linear.bias().tensor()) : std::vector<double>{};
  const int64_t in = linear.in_features(), out = linear.out_features(), rank = linear.lora().rank;
  const int64_t rows = x.numel() / in;
  std::vector<double> y;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> low(static_cast<size_t>(rank), 0.0);
    for (int64_t k = 0; k < rank; ++k) {
      for (int64_t i = 0; i < in; ++i) low[k] += xs[r * in + i] * a[k * in + i];
    }
    for (int64_t o = 0; o < out; ++o) {
      double sum = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < in; ++i) sum += xs[r * in + i] * w[o * in + i];
      double adapter = 0.0;
      for (int64_t k = 0; k < rank; ++k) adapter += low[k] * b[o * rank + k];
      y.push_back(sum + linear.lora().scaling() * adapter);
    }
  }
  return y;
}

void check_near(const std::vector<double>& actual, const std::vector<double>& expected, double tolerance) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(i);
    CHECK(std::fabs(actual[i] - expected[i]) <= tolerance * (1.0 + std::fabs(expected[i])));
  }
}

}  // namespace

TEST_CASE("LoRA: the adapter starts at zero, adds alpha/r x A^T B^T; finite-difference gradients through it") {
  manual_seed(3);
  nn::Linear linear(6, 5, {.dtype = DType::f64});
  const std::vector<double> weight_before = lora_values(linear.weight().tensor());
  linear.add_lora({.rank = 2, .alpha = 6.0}, nn::InitContext{11, "proj"});
  CHECK(linear.has_lora());
  CHECK(linear.lora().scaling() == 3.0);
  CHECK(linear.lora_a().sizes() == Shape{2, 6});
  CHECK(linear.lora_b().sizes() == Shape{5, 2});
  CHECK(linear.named_parameters().size() == 4);
  for (double b : lora_values(linear.lora_b().tensor())) CHECK(b == 0.0);
  for (double a : lora_values(linear.lora_a().tensor())) CHECK(std::fabs(a) <= 1.0 / std::sqrt(6.0));
  CHECK(lora_values(linear.weight().tensor()) == weight_before);

  // At B = 0 the layer is the plain product, bit for bit.
  const Tensor x = lora_input({3, 6}, 1, DType::f64);
  CHECK(lora_values(linear(x)) == lora_values(tessera::linear(x, linear.weight().tensor(), linear.bias().tensor())));

  // With B drawn: the formula, and gradients against finite differences for x, A and B.
  Tensor b = linear.lora_b().tensor();
  ops::copy_(b, lora_input({5, 2}, 2, DType::f64));
  check_near(lora_values(linear(x)), adapted_reference(x, linear, linear.weight().tensor()), 1e-12);
  Tensor input = x;
  input.set_requires_grad(true);
  const autograd::GradcheckResult result = autograd::gradcheck(
      [&](const nn::TensorList& inputs) { return linear(inputs[0]); },
      {input, linear.lora_a().tensor(), linear.lora_b().tensor(), linear.weight().tensor()});
  CHECK_MESSAGE(result.ok, result.report);

  // The same init from the same seed and name, wherever it is drawn.
  nn::Linear twin(6, 5, {.dtype = DType::f64});
  twin.add_lora({.rank = 2, .alpha = 6.0}, nn::InitContext{11, "proj"});
  CHECK(lora_values(twin.lora_a().tensor()) == lora_values(linear.lora_a().tensor()));
}

TEST_CASE("NF4 Linear: a frozen packed weight, the dequantised weight's product, a fresh init the dense one packed") {
  nn::Linear dense(70, 9);
  nn::Linear packed(70, 9);
  dense.reset_parameters(5);
  packed.quantize_nf4();
  packed.reset_parameters(5);  // draws dense's weight and packs it
  CHECK(packed.is_nf4());
  CHECK(packed.weight().tensor().dtype() == DType::u8);
  CHECK(packed.weight().sizes() == Shape{9, ops::nf4_row_bytes(70)});
  CHECK_FALSE(packed.weight().requires_grad());
  CHECK_FALSE(packed.bias().requires_grad());
  CHECK(lora_values(packed.weight().tensor()) == lora_values(ops::nf4_quantize(dense.weight().tensor().detach())));
  CHECK(lora_values(packed.bias().tensor()) == lora_values(dense.bias().tensor()));

  // Quantising a built layer packs its own values.
  nn::Linear from_values(70, 9);
  from_values.reset_parameters(5);
  from_values.quantize_nf4();
  CHECK(lora_values(from_values.weight().tensor()) == lora_values(packed.weight().tensor()));

  // The product is the dequantised weight's, in the input's dtype, and the
  // input still gets its gradient (the frozen weight gets none).
  const Tensor weight = packed.dense_weight(DType::f32);
  CHECK(lora_values(weight) == lora_values(ops::nf4_dequantize(packed.weight().tensor(), 70, DType::f32)));
  Tensor x = lora_input({2, 3, 70}, 3);
  x.set_requires_grad(true);
  const Tensor y = packed(x);
  CHECK(lora_values(y) == lora_values(tessera::linear(x, weight, packed.bias().tensor())));
  autograd::backward(tessera::sum(y));
  CHECK(x.grad().defined());
  CHECK_FALSE(packed.weight().grad().defined());
  CHECK(packed.dense_weight(DType::bf16).dtype() == DType::bf16);

  // Between forward and backward nothing dense is held: the product saves the
  // packed weight and dequantises it again for the input's gradient.
  {
    nn::Linear wide(256, 128, {.bias = false});
    wide.quantize_nf4();
    Tensor input = lora_input({4, 256}, 8);
    input.set_requires_grad(true);
    auto counters = std::make_shared<MemoryCounters>();
    Tensor output;
    {
      const MemoryScope scope(counters);
      output = wide(input);
    }
    CHECK(counters->snapshot().live_bytes == output.nbytes());  // the output alone, not a 128 KiB weight
    autograd::backward(tessera::sum(output));
    const Tensor expected = ops::matmul(ops::ones({4, 128}), wide.dense_weight(DType::f32));
    CHECK(lora_values(input.grad()) == lora_values(expected));
  }

  // load_dense_weight packs given rows.
  const Tensor rows = lora_input({9, 70}, 4);
  packed.load_dense_weight(rows);
  CHECK(lora_values(packed.weight().tensor()) == lora_values(ops::nf4_quantize(rows)));

  // QLoRA: the packed base with an adapter.
  packed.add_lora({.rank = 3, .alpha = 3.0}, nn::InitContext{1, "q"});
  Tensor b = packed.lora_b().tensor();
  ops::copy_(b, lora_input({9, 3}, 5));
  check_near(lora_values(packed(x.detach())), adapted_reference(x.detach(), packed, packed.dense_weight(DType::f32)),
             1e-5);
}

TEST_CASE("NF4 Linear on meta: laid out, not drawn; reset after to_empty packs the dense init") {
  nn::Linear on_meta(64, 4, {.device = kMeta});
  on_meta.quantize_nf4();
  on_meta.add_lora({.rank = 2, .alpha = 4.0}, nn::InitContext{9, ""});
  CHECK(on_meta.weight().tensor().is_meta());
  CHECK(on_meta.weight().sizes() == Shape{4, ops::nf4_row_bytes(64)});
  on_meta.to_empty(kCPU);
  on_meta.reset_parameters(9);
  nn::Linear dense(64, 4);
  dense.reset_parameters(9);
  CHECK(lora_values(on_meta.weight().tensor()) == lora_values(ops::nf4_quantize(dense.weight().tensor().detach())));
  nn::Linear eager(64, 4);
  eager.add_lora({.rank = 2, .alpha = 4.0}, nn::InitContext{9, ""});
  CHECK(lora_values(on_meta.lora_a().tensor()) == lora_values(eager.lora_a().tensor()));
  for (double b : lora_values(on_meta.lora_b().tensor())) CHECK(b == 0.0);
}

TEST_CASE("MLP: an adapted fc or proj leaves the fused GELU path, the unfused layers' values") {
  manual_seed(8);
  nn::MLP mlp(8, 16, 8, std::make_shared<nn::GELU>(GeluApproximation::tanh));
  mlp.fc().add_lora({.rank = 2, .alpha = 2.0}, nn::InitContext{2, "fc"});
  Tensor b = mlp.fc().lora_b().tensor();
  ops::copy_(b, lora_input({16, 2}, 6));
  const Tensor x = lora_input({3, 8}, 7);
  // The fused call would multiply fc's weight alone and drop the adapter (B is not zero).
  const Tensor expected = mlp.proj()(nn::GELU(GeluApproximation::tanh)(mlp.fc()(x)));
  CHECK(lora_values(mlp(x)) == lora_values(expected));
  const Tensor without_adapter = tessera::linear_gelu_linear(x, mlp.fc().weight().tensor(), mlp.fc().bias().tensor(),
                                                             mlp.proj().weight().tensor(), mlp.proj().bias().tensor());
  CHECK(lora_values(mlp(x)) != lora_values(without_adapter));
}

TEST_CASE("LoRA and NF4: the refusals name what is wrong") {
  nn::Linear linear(8, 4);
  CHECK_THROWS_WITH_AS(linear.add_lora({.rank = 0}, {}),
                       doctest::Contains("rank must be in [1, min(in, out) = 4], got 0"), Error);
  CHECK_THROWS_WITH_AS(linear.add_lora({.rank = 5}, {}), doctest::Contains("got 5"), Error);
  CHECK_THROWS_WITH_AS(linear.add_lora({.rank = 2, .alpha = 0.0}, {}), doctest::Contains("alpha must be positive"),
                       Error);
  CHECK_THROWS_WITH_AS(linear.lora(), doctest::Contains("has no LoRA adapter"), Error);
  CHECK_THROWS_WITH_AS(linear.load_dense_weight(ops::zeros({4, 8})), doctest::Contains("is for an NF4 weight"), Error);
  linear.add_lora({.rank = 2}, {});
  CHECK_THROWS_WITH_AS(linear.add_lora({.rank = 2}, {}), doctest::Contains("has an adapter already"), Error);
  linear.quantize_nf4();
  CHECK_THROWS_WITH_AS(linear.quantize_nf4(), doctest::Contains("the weight is NF4 already"), Error);
  CHECK_THROWS_WITH_AS(linear.load_dense_weight(ops::zeros({3, 8})),
                       doctest::Contains("expected this rank's 4 rows of 8, got [3, 8]"), Error);
  CHECK_THROWS_WITH_AS(linear.weight().set_requires_grad(true), doctest::Contains("floating"), Error);
}
